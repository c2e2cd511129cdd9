from rules.core.nextstep import done_words, duration_words, next_step_words


def test_durations_are_spelt_out_with_at_most_two_units() -> None:
    assert duration_words(60) == "1 minute"
    assert duration_words(90) == "1 minute 30 seconds"
    assert duration_words(7500) == "2 hours 5 minutes"
    assert duration_words(86400 + 3600 + 61) == "1 day 1 hour"
    assert duration_words(0) == "0 seconds"


def test_the_next_step_reads_as_a_sentence_not_a_verb() -> None:
    assert next_step_words(["log"], 60) == "in 1 minute this will be logged, unless you keep it"
    assert next_step_words(["cordon", "drain"], 1800) == \
        "in 30 minutes this will be cordoned and drained, unless you keep it"
    assert next_step_words(["kill"], 0).startswith("now this will be ended")


def test_a_plugin_action_is_named_by_its_type() -> None:
    assert done_words(["acme.preempt"]) == "handed to the `acme.preempt` action"
