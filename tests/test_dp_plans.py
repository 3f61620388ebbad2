"""The node layouts of the hierarchical schedules and their codec pairs (one process)."""

import pytest

from coccl.communicator.dp_plans import hierarchical_notes, level_codecs, node_layout
from coccl.compressors import get_compressor


@pytest.mark.parametrize(
    "hosts, local",
    [
        (["a"], 1),
        (["a", "a", "b", "b"], 2),
        (["a", "b", "c"], 1),
        (["a", "a", "a"], 3),
    ],
)
def test_node_major_hosts(hosts, local):
    layout = node_layout(hosts, None)
    assert (layout.local_size, layout.reason) == (local, "")


@pytest.mark.parametrize(
    "hosts",
    [["a", "b", "a", "b"], ["a", "a", "b"], ["a", "b", "b", "a"], ["a", "a", "b", "b", "a", "a"]],
)
def test_hosts_that_are_not_node_major_are_refused(hosts):
    layout = node_layout(hosts, None)
    assert layout.local_size == 0 and "not node-major" in layout.reason
    with pytest.raises(ValueError, match="not node-major"):
        hierarchical_notes(layout, len(hosts), "allreduce", get_compressor("int8"))


def test_local_size_setting_wins_and_must_divide():
    assert node_layout(["a", "b", "a", "b"], 2).local_size == 2
    assert "does not divide" in node_layout(["a"] * 3, 2).reason


@pytest.mark.parametrize(
    "collective, nodes_of, points",
    [("allreduce", 2, 4), ("allreduce", 1, 2), ("reduce_scatter", 2, 2)],
)
def test_notes_count_the_quantizations(collective, nodes_of, points):
    notes = hierarchical_notes(
        node_layout(["a"] * 4, 4 // nodes_of), 4, collective, get_compressor("taco")
    )
    assert notes["quantizations"].startswith(f"{points} per element")
    assert notes["inter compressor"]["id"] == "taco"


def test_level_codecs():
    intra, inter = level_codecs(get_compressor, ("int8", "taco"), "hierarchical", "allreduce")
    assert (intra.codec_id, inter.codec_id) == ("int8", "taco")
    one, same = level_codecs(get_compressor, "int8", "hierarchical", "reduce_scatter")
    assert one is same
    assert level_codecs(get_compressor, "int8", "ring", "allreduce")[1] is None
    with pytest.raises(ValueError, match="is for algorithm='hierarchical'"):
        level_codecs(get_compressor, ("int8", "taco"), "two_shot", "allreduce")
    with pytest.raises(ValueError, match="runs allreduce and reduce_scatter"):
        level_codecs(get_compressor, "int8", "hierarchical", "allgather")
    with pytest.raises(ValueError, match="pair must be"):
        level_codecs(get_compressor, ("int8",), "hierarchical", "allreduce")
