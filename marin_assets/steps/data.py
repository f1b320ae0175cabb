"""Data in: downloads, generated and real corpora, curation stages, tokenizers and token caches.

The step factories (and the specs they take) that turn sources into the datasets and caches a training
step reads, as Marin's `marin.experiment.data` holds `hf_download`, `tokenized` and `mixture`. The readers
at the end are for an experiment's own step function that reads a dataset step's files.
"""

from marin_assets.pipeline.curation.decontaminate import EvalSet, decontaminate_step
from marin_assets.pipeline.curation.exact_dedup import exact_dedup_step
from marin_assets.pipeline.curation.filters import CurationFilter, Verdicts, filter_step
from marin_assets.pipeline.curation.fuzzy_dedup import fuzzy_dedup_step
from marin_assets.pipeline.curation.heuristic_rules import HeuristicRules
from marin_assets.pipeline.curation.heuristics import heuristic_filter_step
from marin_assets.pipeline.curation.html_to_text import html_to_text_step
from marin_assets.pipeline.curation.normalize import normalize_step
from marin_assets.pipeline.curation.planted import EVAL_SETS as PLANTED_EVAL_SETS
from marin_assets.pipeline.curation.planted import planted_corpus_step
from marin_assets.pipeline.curation.quality import quality_filter_step
from marin_assets.pipeline.curation.quality_classifier import quality_classifier_step
from marin_assets.pipeline.curation.shards import Shard
from marin_assets.pipeline.data.corpus import corpus_step
from marin_assets.pipeline.data.download import hf_download_step, url_download_step
from marin_assets.pipeline.data.hub_upload import hub_upload_step
from marin_assets.pipeline.data.preference import preference_data_step
from marin_assets.pipeline.data.python_docs import PythonBuild, python_docs_step
from marin_assets.pipeline.data.readers import iter_records
from marin_assets.pipeline.data.text_files import expand_files, local_dir_for
from marin_assets.pipeline.data.word_problems import word_problems_step
from marin_assets.pipeline.hello import numbers_step, report_step, stats_step
from marin_assets.pipeline.tokens.chat import chat_tokenize_step
from marin_assets.pipeline.tokens.preference_cache import preference_tokenize_step
from marin_assets.pipeline.tokens.pretokenized import pretokenized_step
from marin_assets.pipeline.tokens.tokenize import TokenizeStep, tokenize_step
from marin_assets.pipeline.tokens.tokenizer import bpe_tokenizer_step, existing_tokenizer_step
from marin_assets.pipeline.tokens.validation_suite import ValidationSuite, hf_validation_suite, url_validation_suite

__all__ = [
    # downloads and uploads
    "hf_download_step", "url_download_step", "hub_upload_step",
    # datasets: generated, real, preference pairs, the hello-world example's steps
    "corpus_step", "python_docs_step", "PythonBuild", "word_problems_step", "preference_data_step",
    "numbers_step", "stats_step", "report_step",
    # curation
    "normalize_step", "html_to_text_step", "heuristic_filter_step", "HeuristicRules", "quality_classifier_step",
    "quality_filter_step", "exact_dedup_step", "fuzzy_dedup_step", "decontaminate_step", "EvalSet",
    "planted_corpus_step", "PLANTED_EVAL_SETS",
    # a curation filter of one's own: the seam, what it decides on, what it returns
    "filter_step", "CurationFilter", "Shard", "Verdicts",
    # tokenizers and caches
    "bpe_tokenizer_step", "existing_tokenizer_step", "tokenize_step", "TokenizeStep", "chat_tokenize_step",
    "preference_tokenize_step", "pretokenized_step", "hf_validation_suite", "url_validation_suite",
    "ValidationSuite",
    # reading a dataset step's files in an experiment's own step function
    "iter_records", "expand_files", "local_dir_for",
]
