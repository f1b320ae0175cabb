"""Chat turns checked as OpenAI messages: the rules every reader of conversation data shares.

A turn is an object with a known role and non-blank text. The first bad one is an error naming where it is
(`file, line N`) and which turn, so a bad conversation is found at once and never skipped. It lives in the
data wing so that readers below the tokens wing (preference pairs) check turns exactly as chat tokenizing
(`tokens/chat.py::conversation_messages`) does: both call `checked_turns`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from marin_assets.pipeline.data.readers import DatasetError

OPENAI_ROLES = {"system": "system", "user": "user", "assistant": "assistant"}
"""Role names as they are written → as OpenAI names them (here the same)."""


def json_kind(value: Any) -> str:
    """A value's JSON kind, for messages (`a string`, `an array`, `null`, …)."""
    names = {str: "a string", bool: "a boolean", int: "a number", float: "a number", list: "an array",
             dict: "an object", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def checked_turns(turns: list[Any], where: str, what: str = "turn", role_key: str = "role",
                  text_key: str = "content", roles: Mapping[str, str] = OPENAI_ROLES) -> list[dict[str, str]]:
    """`turns` as OpenAI messages (`{"role", "content"}`, roles renamed by `roles`, other keys dropped). The first
    bad turn is a `DatasetError` `{where}: {what} {i} …` (1-based): not an object, no role, an unknown role,
    text that is not a string, or blank text."""
    messages = []
    for i, turn in enumerate(turns, start=1):
        if type(turn) is not dict:
            raise DatasetError(f"{where}: {what} {i} is {json_kind(turn)}, not an object with {role_key!r} and"
                               f" {text_key!r}")
        role, text = turn.get(role_key), turn.get(text_key)
        if role is None:
            keys = ", ".join(map(repr, turn)) or "none"
            raise DatasetError(f"{where}: {what} {i} has no {role_key!r} (keys: {keys})")
        if not isinstance(role, str) or role not in roles:
            raise DatasetError(f"{where}: {what} {i} has {role_key} {role!r}, not one of {', '.join(map(repr, roles))}")
        if type(text) is not str:
            raise DatasetError(f"{where}: {what} {i} ({role}) has {text_key!r} {json_kind(text)}, not text")
        if not text.strip():
            raise DatasetError(f"{where}: {what} {i} ({role}) is empty")
        messages.append({"role": roles[role], "content": text})
    return messages


__all__ = ["OPENAI_ROLES", "checked_turns", "json_kind"]
