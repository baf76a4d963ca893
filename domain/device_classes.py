"""Device classes at the edge: a class no cluster reports is most often a typo (`NVIDIA-H100`
for `NVIDIA-H100-80GB-HBM3`), and a workload declared with one would wait forever.

A class is known when a cluster of the fleet reports it in its inventory, or when the project
has a quota for it (a quota is a deliberate statement that the class exists, even before a
cluster of it joins). An unknown class close to a reported one is refused, naming the reported
classes and the close ones; an unknown class close to none is taken for a class no cluster has
yet: it is accepted, and placement defers the workload with `no_cluster_has_device_class` until
a cluster reports it. docs/scheduling.md, "Device classes".
"""

from __future__ import annotations

import difflib
from collections.abc import Collection

from wingsmith.domain.base import InvalidValue

CUTOFF = 0.6  # difflib's ratio above which two names are taken for one misspelt
MOST = 3  # close classes named at most


def did_you_mean(device_class: str, reported: Collection[str]) -> list[str]:
    """The reported classes close to `device_class`, closest first: the same but for case,
    one spelt inside the other (a short name for a long one), or close by difflib's ratio."""
    wanted = device_class.casefold()
    by_folded = {r.casefold(): r for r in sorted(reported)}
    same = [by_folded[wanted]] if wanted in by_folded else []
    inside = [r for f, r in by_folded.items() if f != wanted and (wanted in f or f in wanted)]
    close = [
        by_folded[f] for f in difflib.get_close_matches(wanted, by_folded, n=MOST, cutoff=CUTOFF)
    ]
    return list(dict.fromkeys([*same, *inside, *close]))[:MOST]


def check_device_class(
    device_class: str, reported: Collection[str], quota: Collection[str]
) -> None:
    """Refuse a class the fleet does not report and the project has no quota for, when it is
    close to one the fleet reports (`invalid_value` on `device_class`, with `reported` and
    `did_you_mean`). Close to none: accepted, a class no cluster has yet."""
    if device_class in reported or device_class in quota:
        return
    close = did_you_mean(device_class, reported)
    if not close:
        return
    raise InvalidValue(
        f"no cluster reports device class {device_class!r}; did you mean {close[0]!r}? "
        f"(the fleet reports {', '.join(sorted(reported))})",
        field="device_class",
        reported=sorted(reported),
        did_you_mean=close,
    )
