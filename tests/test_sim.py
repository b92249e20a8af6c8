"""The simulator against the closed-form cost model, contention, and calibration."""

from __future__ import annotations

import pytest

from lptrain.comm.algorithms import be, lp, mst, ring
from lptrain.comm.schedule import Kind, Schedule, Transfer
from lptrain.sim import build_topology, simulate
from lptrain.sim import costmodel as cm
from lptrain.sim.calibrate import HostFit, Measurement, compare, fit, measure
from lptrain.sim.topology import oneport, private

ELEMENTS = 1 << 22  # 16 MiB of float32: divisible by every P and block below
BLOCK = 1 << 18  # 1 MiB blocks: k = 16
OPS = ("broadcast", "reduce", "allreduce")


def _constants(topo):
    link = topo.route(0, 1)[0]
    return topo.overhead + link.latency, 1 / link.bandwidth, topo.gamma


def _schedule(algo: str, op: str, p: int):
    if algo.startswith("lp"):
        mode = "reduce_broadcast" if algo == "lp-rb" else "overlapped"
        if op == "allreduce":
            return lp.allreduce(p, ELEMENTS, block=BLOCK, mode=mode)
        return getattr(lp, op)(p, ELEMENTS, 0, block=BLOCK)
    module = {"mst": mst, "be": be, "ring": ring}[algo]
    return module.allreduce(p, ELEMENTS) if op == "allreduce" else getattr(module, op)(p, ELEMENTS, 0)


def _closed_form(algo: str, op: str, p: int, alpha: float, beta: float, gamma: float, ports: str = "multi") -> float:
    n = ELEMENTS * 4
    if algo.startswith("lp"):
        mode = "reduce_broadcast" if algo == "lp-rb" else "overlapped"
        return cm.lp(op, p, n, BLOCK * 4, alpha, beta, gamma, mode, ports=ports)
    return getattr(cm, algo)(op, p, n, alpha, beta, gamma, ports=ports)


@pytest.mark.parametrize("p", [2, 4, 8, 16, 32])
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("algo", ["lp", "lp-rb", "mst", "be", "ring"])
@pytest.mark.parametrize("machine, ports", [(private, "multi"), (oneport, "one")], ids=["private", "oneport"])
def test_simulator_matches_the_closed_form(machine, ports, algo, op, p):
    topo = machine(p)
    alpha, beta, gamma = _constants(topo)
    predicted = simulate(_schedule(algo, op, p), topo).seconds
    assert predicted == pytest.approx(_closed_form(algo, op, p, alpha, beta, gamma, ports), rel=0.01)


def test_one_port_costs_lp_allreduce_twice_its_broadcast_where_private_links_do_not():
    """Single-port: LP's broadcast and reduce stay ~n beta, its overlapped allreduce ~2 n beta."""
    p = 8

    def time(op, topo):
        return simulate(_schedule("lp", op, p), topo).seconds

    assert time("allreduce", oneport(p)) / time("broadcast", oneport(p)) == pytest.approx(2.0, rel=0.1)
    assert time("allreduce", private(p)) / time("broadcast", private(p)) < 1.4
    assert time("reduce", oneport(p)) == pytest.approx(time("reduce", private(p)))


def _hand_made(p: int, pairs: list[tuple[int, int]], nbytes: int = 1 << 26) -> Schedule:
    n = nbytes // 4
    return Schedule("broadcast", "hand", p, n, 0, ((*(Transfer(a, b, 0, n, Kind.COPY) for a, b in pairs),),))


def test_two_transfers_sharing_a_link_take_longer_than_one():
    topo = build_topology("pcie", 8, per_switch=4)
    alone = simulate(_hand_made(8, [(0, 4)]), topo).seconds
    shared_uplink = simulate(_hand_made(8, [(0, 4), (1, 5)]), topo).seconds  # both cross sw0 -> root
    separate = simulate(_hand_made(8, [(0, 4), (2, 3)]), topo).seconds  # 2 -> 3 stays under its switch
    assert shared_uplink == pytest.approx(2 * alone, rel=0.01)
    assert separate == pytest.approx(alone, rel=1e-9)
    both_ways = simulate(_hand_made(8, [(0, 4), (4, 0)]), topo).seconds  # full duplex: no contention
    assert both_ways == pytest.approx(alone, rel=1e-9)


def test_one_port_per_gpu_doubles_lp_overlapped_allreduce():
    """With private links LP (B) is ~n beta; through one PCIe port per GPU it is ~2 n beta."""
    s = lp.allreduce(8, 1 << 26, block=1 << 18, mode="overlapped")  # 256 MiB in k = 256 blocks
    on_private = simulate(s, private(8)).seconds
    on_pcie = simulate(s, build_topology("pcie", 8)).seconds
    assert 1.8 < on_pcie / on_private < 2.1


def test_two_sockets_share_one_slower_link_between_them():
    topo = build_topology("pcie2s", 8, per_switch=2)
    same_socket = simulate(_hand_made(8, [(0, 2)]), topo).seconds  # two switches of socket 0
    across = simulate(_hand_made(8, [(0, 4)]), topo).seconds
    two_across = simulate(_hand_made(8, [(0, 4), (2, 6)]), topo).seconds  # both on the s0 -> s1 link
    assert across > same_socket  # 8 GB/s between the sockets against 12 GB/s PCIe
    assert two_across == pytest.approx(2 * across, rel=0.05)
    # A ring that crosses the sockets twice pays the inter-socket link where the PCIe tree does not.
    ring_time = simulate(ring.allreduce(8, 1 << 24), topo).seconds
    assert ring_time > simulate(ring.allreduce(8, 1 << 24), build_topology("pcie", 8)).seconds


def test_simulates_1024_devices():
    s = lp.allreduce(1024, 1 << 24, block=1 << 20)
    t = simulate(s, build_topology("nodes", 1024)).seconds
    assert 0 < t < 10


def test_bad_topology_arguments():
    valid = "valid topologies: private, oneport, pcie, pcie2s, nvlink, nodes, racks, host"
    with pytest.raises(ValueError, match=valid):
        build_topology("torus", 4)
    with pytest.raises(ValueError, match="P=4 but topology pcie has 8"):
        simulate(ring.allreduce(4, 100), build_topology("pcie", 8))
    with pytest.raises(ValueError, match="at least one device"):
        build_topology("pcie", 0)


def test_fit_recovers_known_constants():
    truth = HostFit(
        call_overhead=20e-6,
        transfer_overhead=7e-6,
        cached_bandwidth=40e9,
        memory_bandwidth=11e9,
        gamma=1 / 30e9,
        cache_bytes=2**20,
    )
    synthetic = []
    for size in (1 << 10, 1 << 14, 1 << 16, 1 << 20, 1 << 24):  # both sides of the 1 MiB "cache"
        for algo, module in (("mst", mst), ("ring", ring), ("be", be)):
            for op in OPS:
                s = module.allreduce(4, size) if op == "allreduce" else getattr(module, op)(4, size, 0)
                seconds = simulate(s, truth.topology(4, size * 4)).seconds
                synthetic.append(Measurement(algo, op, size * 4, seconds, s))
    fitted = fit(synthetic, cache_bytes=2**20)
    for name in ("call_overhead", "transfer_overhead", "cached_bandwidth", "memory_bandwidth", "gamma"):
        assert getattr(fitted, name) == pytest.approx(getattr(truth, name), rel=1e-6), name
    assert all(abs(r["error"]) < 1e-6 for r in compare(synthetic, fitted))


def test_a_constant_the_fit_pinned_to_zero_is_said_so_not_printed_as_an_infinite_rate():
    fitted = HostFit(16e-6, 1.3e-6, 57e9, 16e9, gamma=0.0, cache_bytes=32 << 20)
    said = fitted.describe()
    assert "inf" not in said and "gamma = 0 (pinned by the fit" in said, said
    measured = HostFit(16e-6, 1.3e-6, 57e9, 16e9, gamma=10.8e-12, cache_bytes=32 << 20)
    assert "gamma = 10.8 ps/B (= 92.6 GB/s of additions)" in measured.describe()


def test_calibration_runs_on_this_machine():
    runs = measure(3, [1 << 12, 1 << 16], algos=("lp", "ring"), ops=("allreduce",), trials=1, target_s=0.005)
    model = fit(runs)
    rows = compare(runs, model)
    assert len(rows) == 4 and all(r["measured_s"] > 0 and r["predicted_s"] > 0 for r in rows)


def test_sim_cli_predicts_and_rejects_bad_arguments(capsys):
    from lptrain.sim import cli

    assert (
        cli.main(
            ["predict", "--topology", "nvlink", "--devices", "4", "-b", "1M", "-e", "4M", "-f", "4", "--algo", "lp,be"]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert out.count("\n") == 2 + 4 and " lp " in out and " be " in out
    for argv, message in (
        (["predict", "--algo", "lp,tree"], "unknown algorithm"),
        (["predict", "-b", "1M", "-e", "1K"], "size range is empty"),
        (["predict", "--devices", "0"], "at least 1"),
    ):
        with pytest.raises(SystemExit):
            cli.main(argv)
        assert message in capsys.readouterr().err


def test_reproduce_paper_writes_figures_and_report(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / "reproduce_paper.py"
    kept = "<!-- cluster:paper -->\n## Measured on emulated links\n\nrows\n<!-- /cluster:paper -->"
    (tmp_path / "PAPER_RESULTS.md").write_text(f"# old\n\nSTALE-PARAGRAPH\n\n{kept}\n")  # another script's section
    result = subprocess.run(
        [sys.executable, str(script), "--quick", "--docs", str(tmp_path)], capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr
    text = (tmp_path / "PAPER_RESULTS.md").read_text()
    for heading in ("Claim 1", "Claim 2", "Claim 3", "Claim 4", "depends on the guessed machine", "Measured here"):
        assert heading in text
    for op in ("**broadcast**", "**reduce**", "**allreduce**", "Reduce + broadcast (the paper's iteration)"):
        assert op in text  # the claims answered for the operations the paper makes them about
    for machine in ("oneport", "pcie2s", "private"):
        assert f"| {machine} |" in text
    assert "Nothing in this document was measured on a GPU" in text
    assert text.endswith(kept + "\n") and "STALE-PARAGRAPH" not in text  # rewritten, the measured section kept
    for png in ("time_vs_p", "bandwidth_vs_size", "models_vs_p", "alpha_sensitivity", "calibration"):
        assert (tmp_path / "figures" / f"{png}.png").read_bytes()[:4] == b"\x89PNG"


# -- racks: an uplink rate, a placement, and rank orders priced against them ----------------------


def test_racks_route_through_the_uplink_of_the_placement():
    from lptrain.sim.topology import build_topology

    port = 25e6
    contiguous = build_topology("racks", 4, bandwidth=port, uplink_bandwidth=port / 2)
    interleaved = build_topology("racks", 4, bandwidth=port, uplink_bandwidth=port / 2, placement="interleaved")
    assert contiguous.groups == ((0, 1), (2, 3)) and interleaved.groups == ((0, 2), (1, 3))
    assert [link.bandwidth for link in contiguous.route(0, 1)] == [port, port]
    assert [link.bandwidth for link in contiguous.route(1, 2)] == [port, port / 2, port]
    assert [link.bandwidth for link in interleaved.route(0, 1)] == [port, port / 2, port]
    assert [link.bandwidth for link in interleaved.route(0, 2)] == [port, port]
    listed = build_topology("racks", 4, placement=[1, 0, 0, 1])
    assert listed.groups == ((1, 2), (0, 3)) and "uplinks 1 of a port" in listed.describe()
    assert build_topology("racks", 4, racks=1).groups is None  # one rack: nothing stands out


@pytest.mark.parametrize("placement", ["sideways", [0, 0, 2, 2], [0, 1, 0]])
def test_a_bad_placement_is_refused_in_one_line(placement):
    from lptrain.sim.topology import build_topology

    with pytest.raises(ValueError, match="placement") as err:
        build_topology("racks", 4, placement=placement)
    assert "\n" not in str(err.value)


def test_a_rack_contiguous_order_prices_interleaved_racks_as_contiguous_ones():
    """The order, not the placement, decides what crosses the uplinks: LP's chain and the ring
    over interleaved racks in rack order cost what they cost over contiguous racks, and in
    the natural order they cross the thin uplink at every hop (LP) and cost more."""
    from lptrain.sim.predict import predict, rack_orders
    from lptrain.sim.topology import build_topology

    port, size = 25e6, 1 << 20
    contiguous = build_topology("racks", 4, bandwidth=port, uplink_bandwidth=port / 2)
    interleaved = build_topology("racks", 4, bandwidth=port, uplink_bandwidth=port / 2, placement="interleaved")
    orders = rack_orders(interleaved)
    assert orders["racks"] == [0, 2, 1, 3] and orders["natural"] == [0, 1, 2, 3]
    for algo in ("lp", "ring"):
        base = predict(algo, "allreduce", contiguous, size).seconds
        assert predict(algo, "allreduce", interleaved, size, order=orders["racks"]).seconds == pytest.approx(base)
    natural = predict("lp", "allreduce", interleaved, size).seconds
    assert natural > 1.5 * predict("lp", "allreduce", contiguous, size).seconds


def test_thin_uplinks_favour_lp_over_the_ring_and_a_full_one_does_not():
    """The one-port argument (LP's chain crosses each uplink once, n each way; the ring
    2(P-1)/P n): at half a port LP's allreduce is the cheaper, at a full port the ring."""
    from lptrain.sim.predict import predict
    from lptrain.sim.topology import build_topology

    port = 25e6
    for p, size in ((4, 4 << 20), (8, 16 << 20)):  # big enough that LP's pipeline fills
        thin = build_topology("racks", p, bandwidth=port, uplink_bandwidth=port / 2)
        full = build_topology("racks", p, bandwidth=port)
        assert predict("lp", "allreduce", thin, size).seconds < 0.9 * predict("ring", "allreduce", thin, size).seconds
        assert predict("ring", "allreduce", full, size).seconds < predict("lp", "allreduce", full, size).seconds


def test_rates_and_fractions_of_a_port():
    from lptrain.sim.rates import parse_fraction, parse_rate, uplink_rate

    assert parse_rate("200mbit", "--link") == 25e6 and parse_rate("1gbit", "--link") == 125e6
    assert parse_fraction("1/2", "--uplink") == 0.5 and parse_fraction("0.25", "--uplink") == 0.25
    assert uplink_rate("1/4", 25e6) == 6.25e6 and uplink_rate("100mbit", 25e6) == 12.5e6
    for bad in ("fast", "200mbps", "0mbit"):
        with pytest.raises(ValueError, match="rate such as 200mbit"):
            parse_rate(bad, "--link")
    for bad in ("0", "1/0", "half"):
        with pytest.raises(ValueError, match="rate such as 100mbit or a positive fraction of a port"):
            uplink_rate(bad, 25e6)


def test_sim_cli_prices_racks_with_an_uplink_a_placement_and_an_order(capsys):
    from lptrain.sim import cli

    common = ["predict", "--topology", "racks", "--devices", "4", "--link", "200mbit", "--uplink", "1/2"]
    sizes = ["-b", "1M", "-e", "1M", "--algo", "lp"]

    def lp_time(*extra: str) -> float:
        assert cli.main([*common, *extra, *sizes]) == 0
        out = capsys.readouterr().out
        return float(out.splitlines()[-1].split()[2])

    contiguous = lp_time()
    assert lp_time("--placement", "interleaved", "--order", "racks") == pytest.approx(contiguous)
    assert lp_time("--placement", "0,1,0,1", "--order", "0,2,1,3") == pytest.approx(contiguous)
    assert lp_time("--placement", "interleaved") > 1.5 * contiguous
    for argv, message in (
        (["predict", "--topology", "pcie", "--uplink", "1/2"], "only racks have these"),
        ([*common, "--order", "0,1,1,2"], "--order must be natural, racks, or a permutation"),
        ([*common, "--placement", "sideways"], "unknown placement"),
        ([*common, "--link", "fast"], "--link must be a rate"),
    ):
        with pytest.raises(SystemExit):
            cli.main(argv)
        assert message in capsys.readouterr().err
