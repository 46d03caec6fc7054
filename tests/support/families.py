"""Test models of other chat families: the embedded SmolLM2 weights with a chat template in a
family's format (``tests/support/templates``, written for these tests in each family's
conventions) and, where the family's call marker is a token of its own, a vocabulary whose
unused special tokens are renamed to those markers (``<tool_call>`` ``</tool_call>``,
``[TOOL_CALLS]``), kept ids, so the weights still fit. A model trained with such a marker
knows it; this one learns it the cheap way: each marker's (tied) embedding row becomes a copy
of the row of the text it starts with (``<``, ``</``, ``[``), so the model writes the marker
where it would write that text (and copies it from a few-shot history)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

TEMPLATES = Path(__file__).parent / "templates"
# unused SmolLM2 special tokens (ids kept) -> the family markers
RENAMES = {"<jupyter_code>": "<tool_call>", "<jupyter_output>": "</tool_call>",
           "<reponame>": "[TOOL_CALLS]"}
# FunctionGemma's seven (its template only: their rows would tie with the markers above)
GEMMA_RENAMES = {"<filename>": "<start_function_declaration>",
                 "<gh_stars>": "<end_function_declaration>", "<issue_start>": "<start_function_call>",
                 "<issue_comment>": "<end_function_call>",
                 "<issue_closed>": "<start_function_response>",
                 "<jupyter_start>": "<end_function_response>", "<jupyter_text>": "<escape>"}
LIKE = {"<tool_call>": "<", "</tool_call>": "</", "[TOOL_CALLS]": "[",   # row copied from
        "<start_function_call>": "<", "<end_function_call>": "</", "<escape>": '"'}


def family_model(base: Path, out: Path, template: str, rename: bool = True) -> Path:
    """``base`` (an HF dir) with template ``template`` (a file stem in templates/) in ``out``;
    ``rename``: the markers as tokens of the vocabulary (not special: they decode as text)."""
    out.mkdir(parents=True, exist_ok=True)
    for f in base.iterdir():
        if f.name == "model.safetensors" and not rename:
            (out / f.name).symlink_to(f.resolve())
        elif f.name == "model.safetensors":
            continue
        elif f.name not in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
            shutil.copy(f, out / f.name)
    tok = json.loads((base / "tokenizer.json").read_text())
    cfg = json.loads((base / "tokenizer_config.json").read_text())
    renames = GEMMA_RENAMES if template == "functiongemma" else RENAMES
    if rename:
        vocab = tok["model"]["vocab"]
        for old, new in renames.items():
            vocab[new] = vocab.pop(old)
        for t in tok["added_tokens"]:
            if t["content"] in renames:
                t["content"], t["special"] = renames[t["content"]], False
        for t in cfg.get("added_tokens_decoder", {}).values():
            if t["content"] in renames:
                t["content"], t["special"] = renames[t["content"]], False
        for key in ("additional_special_tokens", "extra_special_tokens"):
            if isinstance(cfg.get(key), list):
                cfg[key] = [t for t in cfg[key] if t not in renames]
    cfg.pop("chat_template", None)
    if rename:
        _marker_rows(base / "model.safetensors", out / "model.safetensors", tok, renames)
    (out / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False))
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, ensure_ascii=False, indent=1))
    shutil.copy(TEMPLATES / f"{template}.jinja", out / "chat_template.jinja")
    return out


def _marker_rows(src: Path, dst: Path, tok: dict, renames: dict) -> None:
    import torch
    from safetensors.torch import load_file, save_file

    state = load_file(str(src))
    emb = state["model.embed_tokens.weight"]               # tied: also the LM head
    vocab = tok["model"]["vocab"]
    with torch.no_grad():
        for marker in renames.values():
            if marker in LIKE:
                emb[vocab[marker]] = emb[vocab[LIKE[marker]]]
    save_file(state, str(dst))
