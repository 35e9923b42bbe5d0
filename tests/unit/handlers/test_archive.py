"""handlers/archive.py: a built archive read in this process."""

from __future__ import annotations

import pytest

from handlers.archive import archived_settings, load_archived


def test_a_directory_that_is_no_built_archive_is_named_with_what_to_run(tmp_path):
    (tmp_path / "mine").mkdir()  # e.g. a build that stopped before its manifest was written
    for read in (archived_settings, load_archived):
        with pytest.raises(FileNotFoundError, match=r"mine is not a built archive; build it with `make archive`"):
            read(tmp_path / "mine")
