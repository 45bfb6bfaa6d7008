"""``polar push-hub``: upload an exported dataset folder to the HuggingFace Hub with ``huggingface_hub``.

The Hub's address is ``huggingface_hub``'s own (``HF_ENDPOINT``, default https://huggingface.co); the token is
``token``, else ``HF_TOKEN`` or the one ``hf auth login`` saved.
"""

from __future__ import annotations

import os
from pathlib import Path

from polar_cli.errors import ConfigError, HubError
from polar_cli.extras import require

OFFLINE = ("1", "on", "yes", "true")


def push_to_hub(folder: Path, repo_id: str, *, private: bool = False, token: str | None = None,
                exist_ok: bool = False) -> str:  # fmt: skip
    """Create the dataset repo ``repo_id`` and upload ``folder`` into it; returns the dataset's URL."""
    if not (folder / "README.md").is_file():
        raise ConfigError(f"{folder} is not an exported dataset (no README.md): run polar export first")
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in OFFLINE:
        raise HubError("HF_HUB_OFFLINE is set: the Hub cannot be reached in offline mode (unset it to push)")
    huggingface_hub = require("huggingface_hub", needed_by="polar push-hub")
    from huggingface_hub.errors import HfHubHTTPError

    token = token or huggingface_hub.get_token()
    if not token:
        raise HubError("no HuggingFace token: pass --token, set HF_TOKEN, or run `hf auth login`")
    api = huggingface_hub.HfApi(token=token)
    try:
        url = api.create_repo(repo_id, repo_type="dataset", private=private, exist_ok=exist_ok)
        api.upload_folder(repo_id=repo_id, folder_path=folder, repo_type="dataset",
                          commit_message="Upload a dataset exported by polar")  # fmt: skip
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else None
        if status == 409:
            raise HubError(f"dataset repo {repo_id} already exists (--exist-ok uploads into it)") from exc
        if status in (401, 403):
            raise HubError(f"the Hub refused the token for {repo_id} ({status})") from exc
        raise HubError(f"the Hub failed ({status}): {str(exc).splitlines()[0]}") from exc
    except (OSError, ValueError) as exc:  # connection errors, bad repo ids (HFValidationError is a ValueError)
        raise HubError(f"cannot push {repo_id}: {exc}") from exc
    return str(url)
