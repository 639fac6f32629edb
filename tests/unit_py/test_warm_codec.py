"""ftrun.warm's control link speaks the agent's own codec (the binding's
encode_warm_fields/decode_warm_fields over plugin/protocol/warm_fields.h):
what the agent refuses, the rank refuses too, and a frame one side writes
the other reads back unchanged.

Run from the build tree: PYTHONPATH=build/python python3 -m pytest tests/unit_py/test_warm_codec.py
"""
import pytest

from ftrun import _ftrun, warm


def test_round_trip_and_the_kinds():
    fields = {"generation": "3", "reason": "boom at step 7", "rank.local": "1", "empty": ""}
    assert warm._decode(warm._encode(fields)) == fields
    # A value's newlines become spaces on the way out (an exception's text): the frame stays one field per line.
    assert warm._decode(warm._encode({"reason": "a\nb"})) == {"reason": "a b"}
    assert warm._encode({"generation": 2}) == b"generation=2\n"
    assert (warm._ERROR, warm._WARM_HELLO, warm._WARM_START) == (3, 32, 35)
    assert warm._MAGIC == 0x46545231


@pytest.mark.parametrize("payload, why", [
    (b"a=1", "last line has no newline"),
    (b"novalue\n", "a line without '='"),
    (b"a=1\na=2\n", "field 'a' given twice"),
    (b"bad key=1\n", "bad key 'bad key'"),
    (b"=1\n", "bad key ''"),
    (b"".join(b"k%d=v\n" % i for i in range(257)), "more than 256 fields"),
])
def test_a_malformed_frame_is_refused_as_the_agent_refuses_it(payload, why):
    with pytest.raises(_ftrun.InvalidArgumentError) as e:
        warm._decode(payload)
    assert why in e.value.message


def test_a_field_the_agent_could_not_read_is_never_sent():
    with pytest.raises(ValueError, match="field 'a b' cannot be sent"):
        warm._encode({"a b": "1"})
