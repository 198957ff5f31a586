"""KILN_LOGS turns on artifact loggers by channel."""

import logging

import pytest

from kiln import logs


@pytest.fixture(autouse=True)
def _off():
    yield
    logs.set_logs("")


def test_channel_enables_that_logger_in_every_package():
    assert logs.set_logs("graph_breaks,recompiles") == ["graph_breaks", "recompiles"]
    assert logging.getLogger("kiln.capture.graph_breaks").isEnabledFor(logging.INFO)
    assert logging.getLogger("kiln.guards.recompiles").isEnabledFor(logging.INFO)
    assert not logging.getLogger("kiln.loopir.fusion").isEnabledFor(logging.INFO)


def test_plus_kiln_is_debug_everywhere():
    logs.set_logs("+kiln")
    assert logging.getLogger("kiln.loopir.fusion").isEnabledFor(logging.DEBUG)
    assert logging.getLogger("kiln").isEnabledFor(logging.DEBUG)


def test_unknown_channel_warns_once_with_valid_names():
    with pytest.warns(UserWarning, match="unknown channel 'grpah'.*graph_breaks"):
        logs.set_logs("grpah")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        logs.set_logs("grpah")


def test_messages_reach_stderr(capfd):
    logs.set_logs("fusion")
    logging.getLogger("kiln.loopir.fusion").info("fused %s", "buf0")
    assert "[kiln.loopir.fusion] fused buf0" in capfd.readouterr().err
