"""Key/value entries and the files that hold them, without the model: segments, spliced and ragged caches, and cache
files whose header and tensors are checked against each other, against the format versions that wrote their fields,
against a digest, and against a signature with the user's own key (`vkv.kv.sign`: another user's file loads only when
trusted). Whether the entries suit a model is checked where a model can run (`vkv.lm.plausible`).

Counting entries, in one vocabulary:

- An entry is one key and value (and bias, if any) of one layer and KV head that attention reads; it stands for one
  or more original tokens.
- A slot is a place along a segment's third dimension (`[layers, kv_heads, slots, head_dim]`); every KV head has the
  same number. Head-wise budgets give heads different numbers of entries, so a head with fewer fills its remaining
  slots with padding: a copy of its first entry under a bias of −inf, which no query attends to (`real` marks the
  slots that hold entries, a finite bias the same). Without padding, slots and entries are the same count, and a
  shape may name that dimension `entries`.
- A span's (or segment's) entries per KV head are its entries summed over layers and KV heads, divided by layers × KV
  heads: a mean, so it may be fractional.
- The ratio is span tokens over entries per KV head (what a budget counts); the stored ratio is span tokens over slots.
- A flat (ragged) cache keeps each head's entries only, no padding; a padded one keeps every slot.

Names that saved files and result rows keep, in these words: a cache file's segment row, like `Segment`, has
`entries` (slots per layer and KV head), `real_entries` (entries per KV head, where some slots are padding) and
`reached` (the entries of all layers and KV heads together); a result row's `compressed_entries` is the span's
entries per KV head and `stored_entries` its slots per layer and KV head; a compression report's rows
(`vkv.kv.report`) name them `entries` (entries per KV head) and `slots`, its totals `compressed_entries` likewise.
"""
