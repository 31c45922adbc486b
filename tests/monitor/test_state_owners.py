"""After a swap the monitor reads each container's state file where the container really is."""

from __future__ import annotations

from pathlib import Path

from gpushare import protocol
from gpushare.monitor import statefile


def test_swapped_containers_read_each_others_directories(tmp_path: Path) -> None:
    for uid, other in (("uid-x", "uid-y"), ("uid-y", "uid-x")):
        directory = tmp_path / "containers" / uid / "c"
        (directory / "state").mkdir(parents=True)
        (directory / protocol.HOST_OWNER_FILE).write_text(f"{other}/c\n")
    (tmp_path / "containers" / "uid-z" / "c" / "state").mkdir(parents=True)
    moved = statefile.owners(tmp_path)
    assert moved == {
        ("uid-y", "c"): tmp_path / "containers" / "uid-x" / "c" / "state",
        ("uid-x", "c"): tmp_path / "containers" / "uid-y" / "c" / "state",
    }
    assert statefile.state_dir_of(tmp_path, "uid-x", "c", moved) == moved[("uid-x", "c")]
    assert statefile.state_dir_of(tmp_path, "uid-z", "c", moved) == statefile.container_dir(
        tmp_path, "uid-z", "c"
    )


def test_a_directory_serving_someone_else_is_not_read_for_its_path_owner(tmp_path: Path) -> None:
    directory = tmp_path / "containers" / "uid-x" / "c"
    (directory / "state").mkdir(parents=True)
    (directory / protocol.HOST_OWNER_FILE).write_text("uid-y/c\n")
    # uid-y/c is not a container of this node any more: only the path owner asks.
    assert statefile.state_dir_of(tmp_path, "uid-x", "c", {}) is None
