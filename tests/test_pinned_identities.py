"""Identities are the product's contract with the outputs already on disk: a change of layout, a
renamed module or a moved class must not change where any output lives."""

import json
import pathlib

from tests.support.identities import PINNED, current_identities


def test_every_identity_is_as_pinned():
    pinned = json.loads((pathlib.Path(__file__).parent.parent / PINNED).read_text())
    now = current_identities()
    assert set(now) == set(pinned), f"steps added or removed: {sorted(set(now) ^ set(pinned))}"
    changed = {name: (pinned[name], now[name]) for name in pinned if pinned[name] != now[name]}
    assert not changed, f"identities changed (pinned, now): {changed}"
