"""flows.common: what the stage flows share (the rest is tested through the stages and `ragen` commands)."""

import pytest

from flows.common import Interrupted, check_stop, watching


def test_work_watching_a_stop_file_ends_at_its_next_check_once_the_file_exists(tmp_path):
    stop = tmp_path / ".stopped" / "20261206-031500"
    with watching(stop):
        check_stop()
        stop.parent.mkdir()
        stop.touch()
        with pytest.raises(Interrupted, match="asked to stop"):
            check_stop()
    check_stop()  # outside the block the file means nothing to this thread
