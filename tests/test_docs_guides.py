"""The guides name every built-in URL scheme, and say which secret wins.

From an operator review: docs/guides/provider.md (its shared stores and its table of
schemes) and docs/guides/custom-backend.md (the built-in names) left out ``redis+unix://``,
and no page said what happens with both RUNTIME_CACHE_SECRET and RUNTIME_CACHE_SECRET_FILE.
"""

from __future__ import annotations

import re
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from runtime_cache import environment
from runtime_cache.registry import OWN_DISTRIBUTION, _distribution

DOCS = Path(__file__).resolve().parent.parent / "docs"


def _built_in() -> dict[str, str]:
    """Scheme -> class, as runtime-cache's own distribution declares them."""
    found = entry_points(group="runtime_cache.backends")
    return {ep.name: ep.value for ep in found if _distribution(ep) == OWN_DISTRIBUTION}


def test_the_guides_name_every_built_in_scheme() -> None:
    schemes = _built_in()
    assert "redis+unix" in schemes
    provider = (DOCS / "guides" / "provider.md").read_text()
    table = provider.split("## Which URL schemes exist", 1)[1]
    custom = (DOCS / "guides" / "custom-backend.md").read_text()
    names = re.search(r"built-in names \(([^)]*)\)", custom)
    assert names is not None
    for scheme in schemes:
        assert f"`{scheme}://" in table, scheme
        assert f"`{scheme}`" in names.group(1), scheme
    shared = re.search(r"A shared store \(([^)]*)\) needs a\s+secret", provider)
    assert shared is not None
    for scheme, target in schemes.items():
        if target.endswith(":RedisBackend"):  # a shared store whatever its URL says
            assert f"`{scheme}://" in shared.group(1), scheme


def test_both_secret_variables_set_the_file_wins_as_the_docs_say(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret_file = tmp_path / "secret"
    secret_file.write_text("from-the-file-0123456789\n")
    secret_file.chmod(0o600)
    monkeypatch.setenv(environment.ENV_SECRET, "from-the-variable-0123456789")
    monkeypatch.setenv(environment.ENV_SECRET_FILE, str(secret_file))
    assert environment.read_secret() == ["from-the-file-0123456789"]
    for page in (DOCS / "security.md", DOCS / "guides" / "provider.md"):
        text = " ".join(page.read_text().split())
        assert "the file wins" in text, page
