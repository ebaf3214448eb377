"""kvref.polling.wait_for: one way to wait, bounded in time and in count."""

import threading

from kvref.polling import wait_for


def test_a_condition_that_holds_ends_the_wait_at_the_ask_it_held():
    asks = []
    assert wait_for(lambda: asks.append(1) or len(asks) == 3, 60, 0.001)
    assert len(asks) == 3


def test_a_condition_that_never_holds_is_asked_a_bounded_number_of_times():
    asks = []
    assert not wait_for(lambda: asks.append(1), 0.05, 0.01)
    assert 1 <= len(asks) <= 0.05 / 0.01 + 2


def test_what_another_thread_brings_about_is_seen():
    done = threading.Event()
    threading.Timer(0.05, done.set).start()
    assert wait_for(done.is_set, 60)
