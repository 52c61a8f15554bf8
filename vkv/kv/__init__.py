"""Key/value entries and the files that hold them, without the model: segments, spliced and ragged caches, and cache
files whose header and tensors are checked against each other, against the format versions that wrote their fields,
and against a digest. Whether the entries suit a model is checked where a model can run (`vkv.lm.plausible`)."""
