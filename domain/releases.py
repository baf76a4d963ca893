"""The NVIDIA Dynamo runtime releases Wingsmith can render, and what each one needs.

A serving config names the Dynamo runtime release it runs (`runtime_release`). The release,
not the engine's own version, picks the runtime image (`nvcr.io/nvidia/ai-dynamo/
<backend>-runtime:<release>`), and the flags the Dynamo worker of that release understands.
Each release ships one version of each engine in its runtime image; a serving config's
`engine_version` is that version unless an image of one's own is given.

The table comes from upstream Dynamo's release data (`docs/fern/assets/releases.json`, the
source of its compatibility and release-artifact pages) and its backends' argument parsers;
docs/operator.md#dynamo-runtime-releases says where each fact comes from. Only stable and
patch releases with a full set of runtime images are listed: `.postN`, `-dev.N` and model
builds carry tags that are no semantic version, or images for some backends only. A release is
only ever added here: stored serving configs name the ones they were validated against.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

RUNTIME_REGISTRY: Final = "nvcr.io/nvidia/ai-dynamo"
# The runtime image repository of each backend, under RUNTIME_REGISTRY.
RUNTIME_REPOSITORIES: Final[Mapping[str, str]] = {
    "vllm": "vllm-runtime",
    "sglang": "sglang-runtime",
    "trtllm": "tensorrtllm-runtime",
}


@dataclass(frozen=True)
class Release:
    """One Dynamo runtime release: the engines its images ship and the flags it speaks."""

    version: str  # the release and its image tag, MAJOR.MINOR.PATCH
    vllm: str  # the engine version each backend's runtime image ships
    sglang: str
    trtllm: str
    # vLLM workers take `--disaggregation-mode prefill|decode` (Dynamo 1.0 on); before, a
    # prefill worker was `--is-prefill-worker` and a decode worker took no flag.
    vllm_disaggregation_mode: bool

    def engine_version(self, backend: str) -> str:
        """The engine version the runtime image of `backend` ships."""
        return {"vllm": self.vllm, "sglang": self.sglang, "trtllm": self.trtllm}[backend]

    def image(self, backend: str) -> str:
        """Dynamo's runtime image of `backend` for this release."""
        return f"{RUNTIME_REGISTRY}/{RUNTIME_REPOSITORIES[backend]}:{self.version}"


def _release(version: str, vllm: str, sglang: str, trtllm: str) -> Release:
    major = int(version.split(".", 1)[0])
    return Release(version, vllm, sglang, trtllm, vllm_disaggregation_mode=major >= 1)


# Newest first. Engine pins from upstream's releases.json; 1.3.1 from its compatibility page
# ("backend pins are otherwise unchanged from v1.3.0").
RELEASES: Final[Mapping[str, Release]] = {
    r.version: r
    for r in (
        _release("1.3.1", vllm="0.23.0", sglang="0.5.14", trtllm="1.3.0rc19"),
        _release("1.3.0", vllm="0.23.0", sglang="0.5.14", trtllm="1.3.0rc19"),
        _release("1.2.1", vllm="0.20.1", sglang="0.5.11", trtllm="1.3.0rc14"),
        _release("1.2.0", vllm="0.20.1", sglang="0.5.11", trtllm="1.3.0rc14"),
        _release("1.1.1", vllm="0.19.0", sglang="0.5.10.post1", trtllm="1.3.0rc11"),
        _release("1.1.0", vllm="0.19.0", sglang="0.5.10.post1", trtllm="1.3.0rc11"),
        _release("1.0.2", vllm="0.16.0", sglang="0.5.9", trtllm="1.3.0rc5.post1"),
        _release("1.0.1", vllm="0.16.0", sglang="0.5.9", trtllm="1.3.0rc5.post1"),
        _release("1.0.0", vllm="0.16.0", sglang="0.5.9", trtllm="1.3.0rc5.post1"),
        _release("0.9.1", vllm="0.14.1", sglang="0.5.8", trtllm="1.3.0rc3"),
        _release("0.9.0", vllm="0.14.1", sglang="0.5.8", trtllm="1.3.0rc1"),
        _release("0.8.1", vllm="0.12.0", sglang="0.5.6.post2", trtllm="1.2.0rc6.post1"),
        _release("0.8.0", vllm="0.12.0", sglang="0.5.6.post2", trtllm="1.2.0rc6.post1"),
        _release("0.7.1", vllm="0.11.0", sglang="0.5.4.post3", trtllm="1.2.0rc3"),
        _release("0.7.0", vllm="0.11.0", sglang="0.5.4.post3", trtllm="1.2.0rc2"),
        _release("0.6.1", vllm="0.11.0", sglang="0.5.3.post2", trtllm="1.1.0rc5"),
        _release("0.6.0", vllm="0.11.0", sglang="0.5.3.post2", trtllm="1.1.0rc5"),
    )
}
LATEST: Final = next(iter(RELEASES))
_LEADING_VERSION = re.compile(r"^[vV]?([0-9]+)\.")


def known(version: str) -> Release:
    """The release `version`; an unknown one is refused with the known ones listed."""
    release = RELEASES.get(version)
    if release is None:
        raise ValueError(
            f"runtime release {version!r} is not a Dynamo release Wingsmith knows; "
            f"known: {', '.join(RELEASES)}"
        )
    return release


def vllm_disaggregation_mode(version: str) -> bool:
    """Whether vLLM workers of this Dynamo version take `--disaggregation-mode`.

    A known release says so itself. Any other version (a legacy config's engine_version, read
    as the release it was used as) goes by its major number; one that cannot be read is taken
    for a current release.
    """
    release = RELEASES.get(version)
    if release is not None:
        return release.vllm_disaggregation_mode
    match = _LEADING_VERSION.match(version)
    return match is None or int(match.group(1)) >= 1
