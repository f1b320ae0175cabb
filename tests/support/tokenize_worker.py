"""Run tokenize() in its own process, so a test can kill it mid-way. argv: out dataset tokenizer"""

import sys

from marin_assets.pipeline.tokens.tokenize import tokenize

out, dataset, tokenizer = sys.argv[1:4]
tokenize(out, dataset, tokenizer, rows_per_commit=200)
