"""LaMR: a learned, query-conditioned code pruner with semantic and dependency rubrics (seed 004).

Layout: crf.py (linear-chain CRF) · model.py (backbone features, fusion, rubric heads, gate, fused CRF) ·
prompt.py (reranker prompt, chunks) · labels.py (rubric labels from AST analysis; pysource.py, tssource.py)
· repair.py + render.py (AST-aware repair, placeholders) · inference.py (chunks → line scores) ·
records.py + dataset.py + train.py (SWE-Pruner records, training) · evaluate.py (end-to-end validation) ·
corpus.py (synthetic corpus from local Python) · checkpoint.py (ours and SWE-Pruner's layout) ·
pruner.py (`LaMR`, the TextPruner) · cli.py (what the command line calls). Lines, the language table,
tree-sitter parsers and placeholder text are shared with longcodezip in vkv.backends.source.
"""

from vkv.backends.lamr.checkpoint import SWE_PRUNER_HUB_ID, load_checkpoint, load_swe_pruner, save_checkpoint
from vkv.backends.lamr.crf import LinearChainCRF
from vkv.backends.lamr.labels import LabelConfig, RubricLabels, rubric_labels
from vkv.backends.lamr.model import DEFAULT_BACKBONE, LaMRConfig, LaMRModel, assemble, build_model
from vkv.backends.lamr.pruner import LaMR
from vkv.backends.lamr.records import Record, read_records, write_records
from vkv.backends.lamr.repair import RepairConfig, Repaired, repair
from vkv.backends.lamr.train import TrainConfig, TrainSummary, fit

__all__ = [
    "DEFAULT_BACKBONE",
    "SWE_PRUNER_HUB_ID",
    "LaMR",
    "LaMRConfig",
    "LaMRModel",
    "LabelConfig",
    "LinearChainCRF",
    "Record",
    "RepairConfig",
    "Repaired",
    "RubricLabels",
    "TrainConfig",
    "TrainSummary",
    "assemble",
    "build_model",
    "fit",
    "load_checkpoint",
    "load_swe_pruner",
    "read_records",
    "repair",
    "rubric_labels",
    "save_checkpoint",
    "write_records",
]
