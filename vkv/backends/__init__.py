"""Text-level compression backends (LongCodeZip, LaMR): given text and a query, return shorter text."""
