from vkv.methods.base import TextMethod, TextWork


class LongCodeZipMethod(TextMethod):
    """LongCodeZip on the conversation: messages are coarse chunks ranked by conditional perplexity against
    the latest user request; paragraphs, code fences and lines inside kept messages are pruned by knapsack."""

    name = "longcodezip"
    options_taken = ("settings", "query_aware", "per_turn")

    def prune(self, work: TextWork, ratio: float) -> list[str]:
        from vkv.backends.longcodezip import LongCodeZip

        pruner = LongCodeZip(work.lm, settings=self.options.get("settings"))
        result = pruner.prune_messages([m.content for m in work.messages], work.query, ratio=ratio)
        return result.report["messages"]

    def config(self) -> dict:
        settings = self.options.get("settings")
        return {
            "settings": vars(settings) if settings is not None else "defaults",
            "query": "each evaluation question" if self.question_aware else "latest user request",
        }
