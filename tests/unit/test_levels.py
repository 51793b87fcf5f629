import pytest

from fairqueue.exceptions import InvalidPriorityError, InvalidPriorityLevelError
from fairqueue.scheduling.levels import (
    DEFAULT_FAIR_WEIGHTS,
    JOB_PRIORITY_CRITICAL,
    JOB_PRIORITY_HIGH,
    JOB_PRIORITY_LOW,
    JOB_PRIORITY_NORMAL,
    PriorityLevel,
    normalize_priority,
    parse_level,
)


def test_weights_are_4_3_2_1():
    assert [DEFAULT_FAIR_WEIGHTS[level] for level in PriorityLevel] == [4, 3, 2, 1]


@pytest.mark.parametrize(
    ("priority", "level"),
    [
        (None, "normal"),
        (0, "normal"),
        (1, "critical"),
        (2, "high"),
        (3, "high"),
        (4, "normal"),
        (5, "normal"),
        (6, "low"),
        (10, "low"),
        (2_097_151, "low"),
    ],
)
def test_normalize_priority__spec_table(priority, level):
    assert normalize_priority(priority) == PriorityLevel(level)


def test_normalize_priority__every_constant_maps_to_its_own_level():
    assert normalize_priority(JOB_PRIORITY_CRITICAL) is PriorityLevel.CRITICAL
    assert normalize_priority(JOB_PRIORITY_HIGH) is PriorityLevel.HIGH
    assert normalize_priority(JOB_PRIORITY_NORMAL) is PriorityLevel.NORMAL
    assert normalize_priority(JOB_PRIORITY_LOW) is PriorityLevel.LOW


@pytest.mark.parametrize("bad", [-1, 1.5, 2.0, "1", True, False, [1]])
def test_normalize_priority__rejects_bad_input_with_a_clear_value_error(bad):
    with pytest.raises(ValueError, match=r"priority=.* is not allowed") as info:
        normalize_priority(bad)
    assert isinstance(info.value, InvalidPriorityError)


def test_parse_level__accepts_names_case_insensitively():
    assert parse_level(" HIGH ") is PriorityLevel.HIGH
    assert parse_level(PriorityLevel.LOW) is PriorityLevel.LOW


def test_parse_level__names_argument_value_and_choices():
    with pytest.raises(InvalidPriorityLevelError) as info:
        parse_level("urgent", argument="priority_override")
    message = str(info.value)
    assert "priority_override='urgent'" in message
    assert "'critical', 'high', 'normal', 'low'" in message
