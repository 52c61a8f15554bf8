"""Factual-recall evaluation: every method is scored by the same questions, references and metrics."""
