"""Container image names of SWE instances (SWE-Gym's / SWE-bench's eval images) for each runtime backend."""

from __future__ import annotations

DEFAULT_PREFIX = "xingyaoww/sweb.eval.x86_64."
DEFAULT_TAG = "latest"


def image_name(instance_id: str, *, prefix: str = DEFAULT_PREFIX, tag: str = DEFAULT_TAG) -> str:
    """``<prefix><instance_id>:<tag>``, the id lower-cased with ``__`` written ``_s_`` (docker forbids ``__`` there)."""
    return f"{prefix}{instance_id.replace('__', '_s_').lower()}:{tag}"


def for_backend(image: str, backend: str) -> str:
    """The image as ``backend`` names it: Apptainer pulls a Docker image through a ``docker://`` URI."""
    if backend == "apptainer" and "://" not in image and not image.endswith(".sif"):
        return f"docker://{image}"
    return image
