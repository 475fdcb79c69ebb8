"""The SQLite file itself: startup on a damaged or unusable store is a clear error that
names the file and what to do (issue 15 item 7: a truncated or corrupted database used
to start silently, serving nothing), a file from the first release is migrated in
place, and a 50-turn session with a 46 KB tool list stores the list once."""

from __future__ import annotations

import os
import sqlite3
import subprocess
from array import array
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from hotloop.store import StoredResponse, StoreError, open_store
from hotloop.store.sqlite import FILE_NAME, MIGRATIONS, SCHEMA_VERSION
from missing import cannot_set_up
from shell_tool import TOOLS


def stored(
    rid: str, previous: str | None = None, tools: list[dict[str, Any]] | None = None
) -> StoredResponse:
    return StoredResponse(
        id=rid,
        owner=None,
        previous_response_id=previous,
        created_at=1,
        response=orjson.dumps({"id": rid, "output": [], "tools": tools or []}),
        input_items=b'[{"role":"user","content":"hi"}]',
        output_token_ids=[1, 2],
        fingerprint="f",
    )


async def filled(directory: Path, count: int = 200) -> None:
    store = await open_store(directory)
    for n in range(count):
        await store.put(stored(f"resp_{n}", tools=TOOLS))
    await store.close()


async def refused(directory: Path, code: str) -> str:
    with pytest.raises(StoreError) as error:
        await open_store(directory)
    assert error.value.code == code
    return error.value.message


async def test_a_file_truncated_to_zero_bytes_is_refused(tmp_path: Path) -> None:
    await filled(tmp_path)
    (tmp_path / FILE_NAME).write_bytes(b"")
    message = await refused(tmp_path, "store_damaged")
    assert str(tmp_path / FILE_NAME) in message and "0 bytes" in message
    assert "backup" in message


async def test_a_corrupt_page_is_refused(tmp_path: Path) -> None:
    await filled(tmp_path)
    path = tmp_path / FILE_NAME
    data = bytearray(path.read_bytes())
    page = 4096
    assert len(data) > 4 * page
    data[2 * page : 3 * page] = os.urandom(page)
    path.write_bytes(bytes(data))
    message = await refused(tmp_path, "store_damaged")
    assert str(path) in message and "corrupt" in message


async def test_a_file_that_is_not_a_database_is_refused(tmp_path: Path) -> None:
    (tmp_path / FILE_NAME).write_bytes(b"this is not sqlite" * 1000)
    message = await refused(tmp_path, "store_damaged")
    assert str(tmp_path / FILE_NAME) in message


async def test_a_data_dir_that_is_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "data").write_text("not a directory")
    message = await refused(tmp_path / "data", "store_unavailable")
    assert str(tmp_path / "data") in message and "--data-dir" in message


async def test_a_schema_from_a_newer_hotloop_is_refused(tmp_path: Path) -> None:
    await filled(tmp_path, 1)
    with sqlite3.connect(tmp_path / FILE_NAME) as db:
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    message = await refused(tmp_path, "store_damaged")
    assert "newer" in message


@pytest.fixture
def read_only_file(tmp_path: Path) -> Iterator[Path]:
    """A database file nobody can write (its directory stays writable): its mode for a
    user, a read-only bind mount of the file over itself for root, which writes any file
    whatever its mode (CI runs as root: there a refused mount fails the test)."""
    path = tmp_path / FILE_NAME
    with sqlite3.connect(path) as db:
        for statement in MIGRATIONS[0]:
            db.execute(statement)
    if os.geteuid() != 0:
        path.chmod(0o444)
        yield path
        return
    mounted = subprocess.run(["mount", "--bind", str(path), str(path)], capture_output=True)
    if mounted.returncode != 0:
        cannot_set_up("a read-only bind mount", mounted.stderr.decode().strip())
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(path)], check=True)
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=False)


async def test_a_read_only_file_is_refused_at_startup(read_only_file: Path) -> None:
    """It used to start and lose every response (issue 11: 10/10)."""
    message = await refused(read_only_file.parent, "store_unavailable")
    assert str(read_only_file) in message and "writable" in message


async def test_a_file_of_the_first_release_is_migrated(tmp_path: Path) -> None:
    """The schema before versioning (no user_version, tools inline, no fingerprint)."""
    with sqlite3.connect(tmp_path / FILE_NAME) as db:
        for statement in MIGRATIONS[0]:
            db.execute(statement)
        for n, previous in ((0, None), (1, "resp_0")):
            body = {"id": f"resp_{n}", "output": [], "tools": TOOLS}
            db.execute(
                "INSERT INTO responses VALUES (?, NULL, ?, 1, ?, ?, ?)",
                (
                    f"resp_{n}",
                    previous,
                    orjson.dumps(body),
                    b'[{"role":"user","content":"hi"}]',
                    array("I", [5, 6]).tobytes(),
                ),
            )
    store = await open_store(tmp_path)
    try:
        assert orjson.loads(await store.get("resp_1", None) or b"")["tools"] == TOOLS
        chain = await store.load_chain("resp_1", None)
        assert chain is not None and [r.id for r in chain.responses] == ["resp_0", "resp_1"]
        assert chain.head.fingerprint == "" and list(chain.head.output_token_ids) == [5, 6]
        await store.put(stored("resp_2", "resp_1", TOOLS))
        chain = await store.load_chain("resp_2", None)
        assert chain is not None and len(chain.responses) == 3
    finally:
        await store.close()
    with sqlite3.connect(tmp_path / FILE_NAME) as db:
        assert db.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)


async def test_fifty_turns_with_a_46_kb_tool_list_store_it_once(tmp_path: Path) -> None:
    tools = TOOLS * 218
    size = len(orjson.dumps(tools))
    assert 40_000 < size < 52_000
    store = await open_store(tmp_path)
    previous = None
    for n in range(50):
        await store.put(stored(f"resp_{n}", previous, tools))
        previous = f"resp_{n}"
    await store.close()
    with sqlite3.connect(tmp_path / FILE_NAME) as db:
        (lists,) = db.execute("SELECT count(*) FROM tool_lists").fetchone()
        (kept,) = db.execute("SELECT sum(length(response)) FROM responses").fetchone()
    assert lists == 1
    # What the responses keep besides the one list is small: no copy of it per turn.
    assert kept < 50 * 200
