"""``polar push-hub``: upload an exported dataset folder to the HuggingFace Hub with ``huggingface_hub``.

The Hub's address is ``huggingface_hub``'s own (``HF_ENDPOINT``, default https://huggingface.co); the token is
``token``, else ``HF_TOKEN`` or the one ``hf auth login`` saved.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from polar_cli import hf_hub
from polar_cli.errors import ConfigError, HubError
from polar_cli.extras import require


def push_to_hub(folder: Path, repo_id: str, *, private: bool = False, token: str | None = None,
                exist_ok: bool = False, on_step: Callable[[str], None] | None = None) -> str:  # fmt: skip
    """Create the dataset repo ``repo_id`` and upload ``folder`` into it; returns the dataset's URL. ``on_step(what)``
    is told each step as it starts."""
    step = on_step or (lambda what: None)
    if not (folder / "README.md").is_file():
        raise ConfigError(f"{folder} is not an exported dataset (no README.md): run polar export first")
    if hf_hub.offline():
        raise HubError(
            "offline mode is on (HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE): the Hub cannot be reached (unset it to push)"
        )
    huggingface_hub = require("huggingface_hub", needed_by="polar push-hub")
    from huggingface_hub.errors import HfHubHTTPError

    token = token or huggingface_hub.get_token()
    if not token:
        raise HubError("no HuggingFace token: pass --token, set HF_TOKEN, or run `hf auth login`")
    hub = hf_hub.endpoint()
    why = hf_hub.unreachable()
    if why is not None:
        raise HubError(f"cannot push {repo_id}: the HuggingFace Hub at {hub} cannot be reached ({why})")
    api = huggingface_hub.HfApi(token=token)
    try:
        with hf_hub.quiet():
            step(f"creating dataset repo {repo_id} at {hub}")
            url = api.create_repo(repo_id, repo_type="dataset", private=private, exist_ok=exist_ok)
            step(f"uploading {_describe(folder)}")
            api.upload_folder(repo_id=repo_id, folder_path=folder, repo_type="dataset",
                              commit_message="Upload a dataset exported by polar")  # fmt: skip
    except HfHubHTTPError as exc:
        status = hf_hub.http_status(exc)
        if status == 409:
            raise ConfigError(f"dataset repo {repo_id} already exists (--exist-ok uploads into it)") from exc
        if status in (401, 403):
            raise HubError(f"cannot push {repo_id}: the Hub at {hub} refused the token (HTTP {status}; pass --token, "
                           "set HF_TOKEN, or run `hf auth login`)") from exc  # fmt: skip
        raise HubError(f"cannot push {repo_id}: the Hub at {hub} answered HTTP {status}: {hf_hub.cause(exc)}") from exc
    except Exception as exc:  # the connection failed midway, a bad repo id (HFValidationError is a ValueError), a file
        if hf_hub.is_network_error(exc):
            raise HubError(f"cannot push {repo_id}: the connection to the HuggingFace Hub at {hub} failed "
                           f"({hf_hub.cause(exc)})") from exc  # fmt: skip
        if isinstance(exc, OSError | ValueError):
            raise HubError(f"cannot push {repo_id}: {hf_hub.cause(exc)}") from exc
        raise
    return str(url)


def _describe(folder: Path) -> str:
    files = [p for p in folder.rglob("*") if p.is_file()]
    size = sum(p.stat().st_size for p in files)
    return f"{len(files)} files ({size / 1e6:.1f} MB) from {folder}"
