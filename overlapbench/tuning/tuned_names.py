"""What a tuned config's file is called: one name per group, never two groups in one file."""

from __future__ import annotations

import hashlib
import json
import re

from overlapbench.tuning.analysis import Group


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9.]+", "-", text.lower()).strip("-") or "unknown"


def file_names(groups: list[Group]) -> dict[Group, str]:
    """`<model>-tp<tp>-<device>-<dtype>.yaml` (a prediction's: `<device>-predicted`). A custom shape's
    name does not tell shapes apart, so it always carries a short hash of the group's identity (tuning
    another custom shape later writes another file); so do groups of one run that would share a name."""
    stems = {g: f"{slug(g.model)}-tp{g.tp}-{slug(g.device_label)}-{slug(g.dtype)}" for g in groups}
    counts: dict[str, int] = {}
    for stem in stems.values():
        counts[stem] = counts.get(stem, 0) + 1
    hashed = {g for g, s in stems.items() if counts[s] > 1 or g.model == "custom"}
    return {g: (f"{s}-{_digest(g)}" if g in hashed else s) + ".yaml" for g, s in stems.items()}


def _digest(group: Group) -> str:
    identity = json.dumps([group.device_label, group.world_size, group.tp, group.shape, group.dtype])
    return hashlib.sha1(identity.encode()).hexdigest()[:8]
