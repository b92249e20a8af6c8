"""comm=auto on a topology: declared racks, the probe's racks, and what auto chooses on them.

The choice is shown in the simulator (always): on racks joined by thin uplinks auto runs
LP's chain with each rack contiguous, on a star the ring. The probe's grouping is shown on
synthetic pair rates (what the round robin of pairs would measure on given racks); the
probe across processes on an emulated cluster is in test_cluster_topology.py.
"""

from __future__ import annotations

import random

import pytest
import torch

from lptrain.auto import AutoCommunicator, simulated_choice
from lptrain.auto.probed import racks_model
from lptrain.comm.topology_probe import Racks, group_racks, pair_rounds
from lptrain.comm.transport import LinkCost
from lptrain.errors import ConfigError
from lptrain.settings.locations import compose
from lptrain.sim.declared import DeclaredRacks, check_topology, parse_topology, topology_of

MiB = 1 << 20
PORT = 25e6  # 200 Mbit/s, lptrain-cluster's usual port


def rack_contiguous(order: list[int], groups: tuple[tuple[int, ...], ...]) -> bool:
    """Whether ``order`` visits each rack's ranks one after the other."""
    rack_of = {r: i for i, g in enumerate(groups) for r in g}
    racks = [rack_of[r] for r in order]
    changes = sum(1 for a, b in zip(racks, racks[1:]) if a != b)
    return changes == len(groups) - 1


# -- declared topologies ----------------------------------------------------------------------


def test_declared_racks_parse_into_the_simulators_racks():
    assert parse_topology("pcie") == "pcie"
    assert parse_topology("racks:2@1/2") == DeclaredRacks(2, "contiguous", 0.5)
    assert parse_topology("racks:3@0.25:interleaved") == DeclaredRacks(3, "interleaved", 0.25)
    assert parse_topology("racks:0-1-1-0@1/2") == DeclaredRacks(2, (0, 1, 1, 0), 0.5)
    topo = topology_of("racks:2@1/4:interleaved", 8)
    assert topo.groups == ((0, 2, 4, 6), (1, 3, 5, 7)) and "uplinks 0.25 of a port" in topo.layout
    assert parse_topology(parse_topology("racks:0-1-1-0@1/2").text()) == DeclaredRacks(2, (0, 1, 1, 0), 0.5)


@pytest.mark.parametrize(
    "text, p, message",
    [
        ("rack:2@1/2", 4, "neither a model"),
        ("racks:2", 4, "neither a model"),
        ("racks:2@0", 4, "positive fraction"),
        ("racks:2@1/2:sideways", 4, "unknown placement 'sideways'"),
        ("racks:0-1@1/2:interleaved", 2, "a rack per rank already places them"),
        ("racks:0-1-0@1/2", 4, "places 3 ranks, not the 4"),
        ("racks:0-2-0-2@1/2", 4, "racks numbered from 0 with none empty"),
        ("racks:5@1/2", 4, "5 racks for 4 ranks"),
    ],
)
def test_a_bad_declared_topology_is_refused_in_one_line(text, p, message):
    with pytest.raises(ValueError, match=message) as err:
        check_topology(text, p)
    assert "\n" not in str(err.value)


def test_the_config_takes_declared_racks_and_refuses_bad_ones_in_one_line():
    from lptrain.settings.checks import check_config

    declared = "comm.options.topology=racks:2@1/2:interleaved"
    good = check_config(compose(["comm=auto", declared, "trainer.devices=cpu*4"]))
    assert good.comm.options.topology == "racks:2@1/2:interleaved"
    check_config(compose(["comm=auto", "comm.options.topology=probe", "trainer.devices=cpu*4"]))
    for value, message in (
        ("pcie3", "comm.options.topology=pcie3 is not valid; topology 'pcie3' is neither a model"),
        ("racks:0-1-0@1/2", "comm.options.topology=racks:0-1-0@1/2 is not valid; .*places 3 ranks, not the 4"),
    ):
        with pytest.raises(ConfigError, match=message) as err:
            check_config(compose(["comm=auto", f"comm.options.topology={value}", "trainer.devices=cpu*4"]))
        assert "\n" not in str(err.value) and "or probe" in str(err.value)


# -- what auto chooses, in the simulator -----------------------------------------------------------


@pytest.mark.parametrize("p", [4, 8])
@pytest.mark.parametrize("uplink", ["1/2", "1/4"])
@pytest.mark.parametrize("placement", ["", ":interleaved"])
@pytest.mark.parametrize("port", [None, PORT])  # the racks model's 100 Gb/s ports; lptrain-cluster's 200 Mbit/s
def test_on_thin_uplinks_auto_runs_lp_with_each_rack_contiguous(p, uplink, placement, port):
    declared = parse_topology(f"racks:2@{uplink}{placement}")
    topo = DeclaredRacks(declared.racks, declared.placement, declared.uplink, port=port).build(p)
    choice = simulated_choice("allreduce", 16 * MiB, p, topo)
    assert choice.algo == "lp" and choice.options.get("allreduce", "overlapped") == "overlapped", choice
    order = choice.options.get("order", list(range(p)))
    assert rack_contiguous(order, topo.groups), choice
    assert (placement == "") == (order == list(range(p))), choice  # contiguous racks keep 0..P-1
    named = "-".join(map(str, order)) if placement else "natural"
    assert choice.summary.startswith("lp block=") and choice.summary.endswith(f" order={named}"), choice.summary


@pytest.mark.parametrize("p", [4, 8])
@pytest.mark.parametrize("size", [16 * MiB, 64 * MiB])
@pytest.mark.parametrize("port", [None, PORT])
def test_on_a_star_auto_runs_the_ring(p, size, port):
    """One switch (racks:1@1, what the probe reports where nothing shares a link), and racks
    whose uplinks are as wide as a port's: the ring, in the natural order."""
    for racks in (1, 2):
        topo = DeclaredRacks(racks, "contiguous", 1.0, port=port).build(p)
        choice = simulated_choice("allreduce", size, p, topo)
        assert choice.algo == "ring" and "order" not in choice.options, (racks, choice)


def test_auto_on_declared_racks_sums_correctly_and_says_what_it_chose_and_why():
    devices = ["cpu"] * 4
    built: list[tuple[str, dict]] = []

    def build(algo, options):
        from lptrain.communicators import build_communicator

        built.append((algo, options))
        return build_communicator(algo, devices, **options)

    auto = AutoCommunicator(
        build, executor="in-process", device_type="cpu", world_size=4, topology="racks:2@1/2:interleaved"
    )
    count = 16 * MiB // 4
    tensors = [torch.randn(count, generator=torch.Generator().manual_seed(r)) for r in range(4)]
    expected = torch.stack(tensors).sum(0)
    auto.allreduce(tensors)
    for t in tensors:
        torch.testing.assert_close(t, expected, rtol=1e-5, atol=1e-5)
    assert len(built) == 1 and built[0][0] == "lp" and built[0][1]["order"] == [0, 2, 1, 3], built
    lines = auto.describe("choice")
    assert lines[0] == "machine: racks:2@1/2:interleaved model: 2 racks [0 2] [1 3], uplinks 0.5 of a port"
    assert lines[1].startswith("allreduce of 16M: lp") and "order 0-2-1-3" in lines[1] and "simulated" in lines[1]
    assert auto.chose("allreduce", 16 * MiB).endswith("order=0-2-1-3")


def test_auto_refuses_a_probe_in_one_process():
    with pytest.raises(Exception, match="topology=probe measures the links between processes"):
        AutoCommunicator(lambda a, o: None, executor="in-process", device_type="cpu", world_size=4, topology="probe")


def test_the_bench_row_names_what_auto_chose(capsys):
    from lptrain.bench.cli import main

    argv = ["--devices", "4", "--algo", "auto", "--topology", "racks:2@1/2:interleaved", "-b", "16M", "-e", "16M"]
    assert main([*argv, "--op", "allreduce", "--iters", "1", "--trials", "1", "--warmup", "1"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if " auto " in line)
    assert row.rstrip().endswith("auto: lp block=auto order=0-2-1-3"), row


# -- the probe's grouping, on synthetic measurements ------------------------------------------------


def synthetic_rates(rack_of: list[int], port: float, uplink: float, noise: float = 0.0, seed: int = 0):
    """What the round robin of pairs measures on racks joined through rack 0's switch: a pair
    inside a rack at a port's rate; the cross pairs of a round sharing each uplink they take
    (each direction its own), none above a port."""
    rng = random.Random(seed)
    world = len(rack_of)
    rates = [[0.0] * world for _ in range(world)]
    for pairs in pair_rounds(world):
        load: dict[int, int] = {}
        for a, b in pairs:
            for rack in {rack_of[a], rack_of[b]} - {0} if rack_of[a] != rack_of[b] else ():
                load[rack] = load.get(rack, 0) + 1
        for a, b in pairs:
            rate = port
            if rack_of[a] != rack_of[b]:
                rate = min(port, *(uplink / load[r] for r in {rack_of[a], rack_of[b]} - {0}))
            rate *= 1 + rng.uniform(-noise, noise)
            rates[a][b] = rates[b][a] = rate
    return rates


def test_pair_rounds_meet_every_pair_once_in_disjoint_pairs():
    for world in range(2, 10):
        rounds = pair_rounds(world)
        met = [pair for pairs in rounds for pair in pairs]
        assert sorted(met) == [(a, b) for a in range(world) for b in range(a + 1, world)]
        for pairs in rounds:
            ranks = [r for pair in pairs for r in pair]
            assert len(ranks) == len(set(ranks))
        assert len(rounds) == world - 1 + world % 2


@pytest.mark.parametrize(
    "rack_of",
    [[0, 0, 1, 1], [0, 1, 0, 1], [0, 0, 0, 0, 1, 1, 1, 1], [0, 1, 0, 1, 0, 1, 0, 1], [0, 1, 1, 0, 2, 2, 1, 0]],
)
@pytest.mark.parametrize("fraction", [0.5, 0.25])
@pytest.mark.parametrize("noise", [0.0, 0.1])
def test_the_probe_groups_pairs_into_the_racks_and_estimates_the_uplink(rack_of, fraction, noise):
    world = len(rack_of)
    rates = synthetic_rates(rack_of, PORT, fraction * PORT, noise)
    racks = group_racks(rates, pair_rounds(world))
    expected = sorted(tuple(r for r in range(world) if rack_of[r] == k) for k in range(max(rack_of) + 1))
    assert sorted(racks.groups) == expected, racks
    assert racks.port_bps == pytest.approx(PORT, rel=noise + 1e-9)
    assert racks.uplink_bps == pytest.approx(fraction * PORT, rel=2 * noise + 0.01), racks.describe()


def test_the_probe_finds_one_switch_where_every_pair_runs_at_a_ports_rate():
    rates = synthetic_rates([0] * 6, PORT, PORT, noise=0.15)
    racks = group_racks(rates, pair_rounds(6))
    assert racks.groups == ((0, 1, 2, 3, 4, 5),) and racks.uplink_bps is None
    assert "every rank reaches every other" in racks.reason


def test_the_probe_does_not_invent_racks_from_rates_that_do_not_split():
    """One slow pair (a busy core, a lost packet) joins no rack and splits none: 0-1 fast,
    1-2 fast, 0-2 slow cannot be two racks, and the probe says so."""
    rates = synthetic_rates([0, 0, 0, 0], PORT, PORT)
    for a, b in ((0, 2), (0, 3), (1, 2)):
        rates[a][b] = rates[b][a] = PORT / 4
    racks = group_racks(rates, pair_rounds(4))
    assert len(racks.groups) == 1 and "do not split into racks" in racks.reason
    assert len(group_racks([[0, PORT], [PORT, 0]], pair_rounds(2)).groups) == 1


@pytest.mark.parametrize("rack_of", [[0, 1, 0, 1], [0, 1, 0, 1, 0, 1, 0, 1], [1, 0, 0, 1, 1, 0, 0, 1]])
def test_auto_on_the_probes_racks_runs_lp_with_each_rack_contiguous(rack_of):
    world = len(rack_of)
    racks = group_racks(synthetic_rates(rack_of, PORT, PORT / 2, 0.05), pair_rounds(world))
    model = racks_model(racks)
    assert model.groups == racks.groups and "measured at start: 2 racks" in model.layout
    choice = simulated_choice("allreduce", 16 * MiB, world, model)
    assert choice.algo == "lp" and rack_contiguous(choice.options["order"], racks.groups), choice
    star = racks_model(group_racks(synthetic_rates([0] * world, PORT, PORT, 0.05), pair_rounds(world)))
    assert simulated_choice("allreduce", 16 * MiB, world, star).algo == "ring"


# -- what auto chooses with the figures measured on the emulated cluster ----------------------------
# lptrain-cluster, 200mbit ports, 2-core host, 2026-12-05: what the probe and the link measurement
# printed at start. At P = 16 on the star the fastest lone 8-byte exchange took 1.6 ms (sixteen
# processes on two cores); on 8 nodes in 2 racks with 100mbit uplinks 0.75 ms, the ring of the
# link measurement crossing an uplink (12.5 MB/s).
STAR16 = (Racks((tuple(range(16)),), 25.1e6, None, "every rank reaches every other"), LinkCost(1.616e-3, 1 / 25.1e6))
RACKS8 = (
    Racks(((0, 1, 2, 3), (4, 5, 6, 7)), 28.7e6, 17.0e6, "pairs across racks share a slower link"),
    LinkCost(750e-6, 1 / 12.5e6),
)


def test_with_the_per_message_cost_measured_at_p16_auto_runs_neither_broadcast_nor_allreduce_as_be():
    """At P = 16 and 4 MiB the emulated star measured LP's broadcast at 252 ms, BE's at 318; the
    ring's allreduce at 324, BE's at 334 (gloo's own 317). Priced with the 1.6 ms paid at every
    step on top of its bytes, BE's 8 steps beat the ring's 30 and LP's pipeline: the per-message
    cost is paid while the link carries the last message, not after it."""
    model = racks_model(*STAR16)
    broadcast = simulated_choice("broadcast", 4 * MiB, 16, model)
    assert broadcast.algo == "lp", broadcast
    allreduce = simulated_choice("allreduce", 4 * MiB, 16, model)
    assert allreduce.algo == "ring", allreduce


def test_with_the_figures_measured_on_thin_uplink_racks_at_p8_auto_runs_lp_rack_contiguous():
    """8 nodes, 2 racks, uplinks at half a port, 4 and 16 MiB: LP's chain with each rack
    contiguous (the natural order here). Measured at 4 MiB: LP with 64 KiB blocks 469 ms, with
    its automatic block (256 KiB, 128 KiB messages) 483, the ring 583, gloo's own 588; at
    16 MiB 1647, 1522, 2369 and 2368: there the automatic block, priced in the executor's
    128 KiB segments (in whole 256 KiB blocks its pipeline fill looked twice as long)."""
    model = racks_model(*RACKS8)
    for size in (4 * MiB, 16 * MiB):
        choice = simulated_choice("allreduce", size, 8, model)
        assert choice.algo == "lp" and "order" not in choice.options, choice
        assert choice.options.get("allreduce", "overlapped") == "overlapped", choice
    assert simulated_choice("allreduce", 16 * MiB, 8, model).options["block_size"] == "auto"


def test_an_overlapped_step_costs_the_larger_of_the_message_cost_and_the_drain():
    """Across processes a step costs max(overhead, drain): LP's broadcast over P - 2 + k steps."""
    from lptrain.sim.predict import predict
    from lptrain.sim.topology import oneport

    p, n, block, rate = 6, 4 * MiB, 256 << 10, 25e6
    for overhead in (1e-3, 20e-3):  # below a block's 10.5 ms on the wire, and above it
        topo = oneport(p, bandwidth=rate, latency=0.0, overhead=overhead, gamma=0.0)
        steps = p - 2 + n // block
        added = predict("lp", "broadcast", topo, n, block_bytes=block).seconds
        assert added == pytest.approx(steps * (overhead + block / rate))
        topo.overlapped = True
        overlapped = predict("lp", "broadcast", topo, n, block_bytes=block).seconds
        assert overlapped == pytest.approx(steps * max(overhead, block / rate))


# -- what crosses the uplink, counted ----------------------------------------------------------------


def uplink_elements(algo: str, p: int, count: int, rack_of: list[int], order=None) -> tuple[int, int]:
    """Elements an allreduce's schedule sends from rack 0 to rack 1, and back."""
    from lptrain.sim.predict import schedule_for

    schedule = schedule_for(algo, "allreduce", p, count, 4, block_bytes=count // 16 * 4, order=order)
    out = sum(t.count for step in schedule.steps for t in step if rack_of[t.src] == 0 and rack_of[t.dst] == 1)
    back = sum(t.count for step in schedule.steps for t in step if rack_of[t.src] == 1 and rack_of[t.dst] == 0)
    return out, back


@pytest.mark.parametrize("p", [4, 8])
def test_the_chosen_order_sends_n_over_each_uplink_where_the_natural_one_sends_more(p):
    """The cause of auto's slowness on interleaved thin-uplink racks, counted: in the natural
    order LP's chain crosses the uplink at every hop and the ring too; in the order auto
    chooses, LP's chain sends n each way over it, the ring 2(P-1)/P n, so LP is chosen."""
    n = 1 << 16
    rack_of = [r % 2 for r in range(p)]
    choice = simulated_choice("allreduce", 16 * MiB, p, topology_of("racks:2@1/2:interleaved", p))
    order = choice.options["order"]
    assert uplink_elements("lp", p, n, rack_of, order) == (n, n)
    assert uplink_elements("ring", p, n, rack_of, order) == (2 * (p - 1) * n // p,) * 2
    assert min(uplink_elements("lp", p, n, rack_of)) >= (p - 1) * n  # the natural order: every hop crosses
    assert min(uplink_elements("ring", p, n, rack_of)) >= 2 * (p - 1) * n // p * (p // 2)


def test_on_a_slow_link_auto_prices_no_lp_block_below_the_one_the_link_sets():
    """The grid of 2026-12-05 (200mbit star, 4 MiB): auto ran LP in 64 KiB blocks, priced below
    LP's own 128 KiB block (what the link carries in 5 ms), and measured 1.40 n/B against LP's
    1.10 for the broadcast at P = 16, 1.71 against 1.25 for the reduce. The model leaves out
    that each message costs more CPU with more processes per core, the reason the link sets
    the block's floor (``lptrain.comm.program.pipeline_block_bytes``): auto prices no smaller one."""
    model = racks_model(*STAR16)
    for op in ("broadcast", "reduce"):
        choice = simulated_choice(op, 4 * MiB, 16, model)
        assert choice.algo == "lp" and choice.options["block_size"] != 64 << 10, choice
