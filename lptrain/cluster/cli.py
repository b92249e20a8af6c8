"""``lptrain-cluster``: a multi-node cluster on one machine, with shaped links, for one command.

    lptrain-cluster --nodes 4 --link 200mbit -- lptrain-bench --op all -b 16M -e 16M
    lptrain-cluster --nodes 4 --link 200mbit -- lptrain trainer.steps=20
    lptrain-cluster --nodes 8 --layout racks --uplink 100mbit -- lptrain-bench --op allreduce
    lptrain-cluster --nodes 4 --slow 2=50mbit -- python3 scripts/profile_dist.py --links
    lptrain-cluster --nodes 16 --link 200mbit --fidelity-only   # can this host carry it?
    lptrain-cluster --clean        # namespaces left by a cluster whose maker was killed (SIGKILL)

Every node is a network namespace with one port of ``--link`` each way (``tc`` token
bucket), joined by a bridge in a switch namespace; one torchrun node runs the command in
each, rendezvousing over those links (gloo). Before the command, the fidelity check
(``lptrain.cluster.fidelity``) has every port send and receive at once (with racks, then
every uplink carry several flows each way at once) and refuses a cluster the host cannot
carry. Rank 0's output is printed; every node's is kept in
``--logs``, beside cluster.txt and fidelity.json. The first Ctrl-C (or SIGTERM) is passed
on to every worker, which gets ``--stop-grace`` seconds to finish its step and save; a
second Ctrl-C ends them at once. On success, failure, timeout or Ctrl-C, every process
started is ended and every namespace made is deleted. Exit codes: the
command's own (the first failing node's), 2 bad arguments or no privilege to make
namespaces, 5 the host cannot carry the cluster (below fidelity), 124 timeout, 130
Ctrl-C, 143 SIGTERM.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import NoReturn

from lptrain.cluster import fidelity as fidelity_check
from lptrain.cluster import usage as link_usage
from lptrain.cluster.fidelity import OPTION as ACCEPT_LOW_FIDELITY
from lptrain.cluster.fidelity import Fidelity
from lptrain.cluster.launch import STOP_GRACE_S, Launch, LinkDown, Stop, run_on_cluster
from lptrain.cluster.netns import (
    Cluster,
    ClusterError,
    allowed_congestion,
    can_unshare_user,
    congestion_control,
    has_net_admin,
    hosts_text,
    privilege_problem,
    remove_prefix,
    stale_prefixes,
)
from lptrain.cluster.plan import (
    DEFAULT_EGRESS,
    EGRESS,
    LAYOUTS,
    PLACEMENTS,
    ClusterPlan,
    ClusterSpec,
    ClusterSpecError,
    build_plan,
    parse_rate,
)
from lptrain.exits import EXIT_LOW_FIDELITY, EXIT_USAGE, quiet_on_closed_pipe

IN_USERNS = "LPTRAIN_CLUSTER_IN_USERNS"


def _say(message: str) -> None:
    sys.stderr.write(f"lptrain-cluster: {message}\n")  # one write: nodes' lines share the terminal
    sys.stderr.flush()


def _fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    _say(f"error: {message}")
    sys.exit(code)


def parse_slow(items: list[str]) -> dict[int, int]:
    slow = {}
    for item in items:
        node, sep, rate = item.partition("=")
        if not sep or not node.strip().isdigit():
            raise ClusterSpecError(f"--slow takes NODE=RATE such as 2=50mbit, got {item!r}")
        slow[int(node)] = parse_rate(rate, f"--slow {item}")
    return slow


def parse_link_down(text: str | None, cue: str | None) -> LinkDown | None:
    if text is None:
        return None
    node, sep, after = text.partition("@")
    try:
        seconds = float(after) if sep else 0.0
        if not node.strip().isdigit() or seconds < 0:
            raise ValueError
    except ValueError:
        raise ClusterSpecError(f"--link-down takes NODE@SECONDS such as 2@1.5, got {text!r}") from None
    return LinkDown(int(node), seconds, cue)


class _OneLineParser(argparse.ArgumentParser):
    """argparse's own errors (an unknown option, a choice not among ``choices``) in one
    line, like every other refusal, instead of the usage and the error on two."""

    def error(self, message: str) -> NoReturn:
        _fail(message)


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineParser(
        prog="lptrain-cluster",
        description="Run a command across an emulated multi-node cluster (network namespaces, shaped links).",
        usage="lptrain-cluster [options] -- COMMAND [ARGS ...]",
    )
    parser.add_argument("--nodes", type=int, default=4, help="nodes (namespaces), 2 to 64 (default 4)")
    parser.add_argument("--link", default="200mbit", help="each node's port rate, each way (default 200mbit)")
    parser.add_argument("--layout", choices=LAYOUTS, default="star", help="star (one switch) or racks")
    parser.add_argument("--racks", type=int, default=2, help="with --layout racks: how many (default 2)")
    parser.add_argument("--uplink", help="with --layout racks: each rack's uplink rate (default: --link)")
    parser.add_argument(
        "--placement",
        choices=PLACEMENTS,
        default="contiguous",
        help="with --layout racks: consecutive nodes in a rack (default), or node i in rack i %% racks",
    )
    parser.add_argument(
        "--congestion",
        metavar="NAME",
        help="TCP's congestion control in every node (default bbr where the kernel allows it, else the host's; "
        "the choice is the kernel's net.ipv4.tcp_allowed_congestion_control)",
    )
    parser.add_argument(
        "--egress",
        choices=EGRESS,
        default=DEFAULT_EGRESS,
        help="how the ports queue what they carry: per-pair (the default: per-peer, and the switch's port toward "
        "a node a FIFO per source), per-peer (a FIFO per destination at each node's own port, as a host keeps a "
        "queue per flow, and TCP's pure ACKs alone first) or shared (one FIFO, every packet under 128 bytes first: "
        "the shaper of the figures measured before 2026-12-07)",
    )
    parser.add_argument("--slow", action="append", default=[], metavar="NODE=RATE", help="one node's own port rate")
    parser.add_argument("--nproc-per-node", type=int, default=1, help="processes per node (default 1)")
    parser.add_argument("--timeout", type=float, help="seconds before everything is stopped (default: none)")
    parser.add_argument("--grace", type=float, default=30.0, help="seconds the others get after a node fails")
    parser.add_argument(
        "--stop-grace",
        type=float,
        default=STOP_GRACE_S,
        metavar="SECONDS",
        help=f"after the first Ctrl-C or SIGTERM, which every worker gets once: seconds they get to finish "
        f"their step and save (a training run's checkpoint) before they are killed (default {STOP_GRACE_S:g}); "
        "a second Ctrl-C kills them at once",
    )
    parser.add_argument("--logs", type=Path, help="folder for each node's log (default outputs/cluster/DATE/TIME-PID)")
    parser.add_argument("--link-down", metavar="NODE@SECONDS", help="take a node's link down (fault injection)")
    parser.add_argument("--link-down-cue", metavar="TEXT", help="count --link-down's seconds from rank 0 printing TEXT")
    parser.add_argument(
        "--link-usage",
        type=float,
        nargs="?",
        const=link_usage.INTERVAL_S,
        metavar="SECONDS",
        help="while the command runs, read every shaped link's queue counters each SECONDS "
        f"(default {link_usage.INTERVAL_S:g}) and report what each carried and where data queued "
        "(links.txt, links.csv and links.png in --logs)",
    )
    parser.add_argument(
        "--link-usage-from",
        metavar="TEXT",
        help='with --link-usage: count from rank 0 printing TEXT (such as "lptrain-bench allreduce", '
        "after the benchmark's own link measurement)",
    )
    parser.add_argument("--quiet", action="store_true", help="do not print rank 0's output (it is still logged)")
    parser.add_argument("--clean", action="store_true", help="remove namespaces left by killed lptrain-clusters")
    parser.add_argument("--check", action="store_true", help="say whether namespaces can be made here, and exit")
    parser.add_argument(
        "--fidelity-only",
        action="store_true",
        help="make the cluster, run the fidelity check, print it and exit (no command)",
    )
    parser.add_argument(
        "--fidelity-window",
        type=float,
        default=fidelity_check.WINDOW_S,
        metavar="SECONDS",
        help=f"how long the fidelity check counts (default {fidelity_check.WINDOW_S:g} s; the tests use a "
        "fraction of a second, enough to catch a host that cannot carry the links)",
    )
    parser.add_argument(
        ACCEPT_LOW_FIDELITY,
        action="store_true",
        help="run even where the fidelity check finds the host cannot carry the links (the output "
        "then says the figures are below fidelity)",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command each node runs (after --)")
    return parser


def resolve_command(command: list[str]) -> list[str]:
    """The command with its program as an absolute path: looked up beside this Python first
    (``python3`` is then this venv's, and its console scripts work without activating it),
    then on PATH."""
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise ClusterSpecError("give the command to run after --, e.g. lptrain-cluster -- lptrain-bench")
    program = command[0]
    found = shutil.which(program, path=str(Path(sys.executable).parent)) or shutil.which(program)
    if found is None:
        raise ClusterSpecError(f"command {program!r} was not found on PATH or beside {sys.executable}")
    return [found, *command[1:]]


def default_log_dir() -> Path:
    now = datetime.datetime.now()
    return Path("outputs") / "cluster" / now.strftime("%Y-%m-%d") / f"{now.strftime('%H-%M-%S')}-{os.getpid()}"


def _reexec_in_user_namespace(argv: list[str]) -> None:
    """Run this command again inside a new user namespace (as its root), where it may make
    network namespaces: they are private to it and vanish with it."""
    env = dict(os.environ, **{IN_USERNS: "1"})
    code = subprocess.call(
        ["unshare", "--user", "--map-root-user", "--net", "--mount", "--fork", "--kill-child",
         sys.executable, "-m", "lptrain.cluster.cli", *argv],
        env=env,
    )  # fmt: skip
    sys.exit(code)


def _private_mounts(plan) -> None:
    """Inside our own mount namespace: a fresh /run/netns for ``ip netns`` to write into, and
    an /etc/hosts that names the nodes (where /etc/netns, which root would use, is not ours)."""
    target = Path("/run/netns") if Path("/run/netns").is_dir() else Path("/run")
    subprocess.run(["mount", "-t", "tmpfs", "lptrain-cluster", str(target)], check=True)
    Path("/run/netns").mkdir(exist_ok=True)
    hosts = Path("/run/netns/.hosts")
    hosts.write_text(hosts_text(plan))
    subprocess.run(["mount", "--bind", str(hosts), "/etc/hosts"], check=False, capture_output=True)


def _validated(args: argparse.Namespace) -> tuple[ClusterSpec, list[str], LinkDown | None]:
    """The cluster, the command and the fault asked for; a ClusterSpecError names what is wrong."""
    spec = ClusterSpec(
        nodes=args.nodes,
        link_bits=parse_rate(args.link),
        layout=args.layout,
        racks=args.racks,
        uplink_bits=parse_rate(args.uplink, "--uplink") if args.uplink else None,
        slow=parse_slow(args.slow),
        placement=args.placement,
    )
    command = [] if args.fidelity_only and not args.command else resolve_command(args.command)
    link_down = parse_link_down(args.link_down, args.link_down_cue)
    if link_down is not None and not 0 <= link_down.node < spec.nodes:
        raise ClusterSpecError(f"--link-down names node {link_down.node}, but the nodes are 0..{spec.nodes - 1}")
    if args.nproc_per_node < 1:
        raise ClusterSpecError(f"--nproc-per-node must be at least 1, got {args.nproc_per_node}")
    if args.timeout is not None and args.timeout <= 0:
        raise ClusterSpecError(f"--timeout must be a positive number of seconds, got {args.timeout}")
    if not args.fidelity_window > 0:
        raise ClusterSpecError(f"--fidelity-window must be a positive number of seconds, got {args.fidelity_window}")
    if args.link_usage is not None and not args.link_usage > 0:
        raise ClusterSpecError(f"--link-usage must be a positive number of seconds, got {args.link_usage}")
    if args.link_usage_from is not None and args.link_usage is None:
        raise ClusterSpecError("--link-usage-from counts the link usage from a cue: give --link-usage too")
    if args.grace < 0:
        raise ClusterSpecError(f"--grace must be a number of seconds, at least 0, got {args.grace}")
    if not args.stop_grace >= 0:
        raise ClusterSpecError(f"--stop-grace must be a number of seconds, at least 0, got {args.stop_grace}")
    if args.congestion is not None:
        allowed = allowed_congestion()
        if allowed is None or args.congestion not in allowed:
            choices = ", ".join(allowed) if allowed else "none could be read"
            raise ClusterSpecError(
                f"--congestion {args.congestion}: a namespace may choose only what the kernel allows "
                f"(net.ipv4.tcp_allowed_congestion_control: {choices})"
            )
    return spec, command, link_down


def _clean() -> None:
    """``--clean``: remove what killed lptrain-clusters left behind."""
    stale = stale_prefixes()
    for prefix in stale:
        _say(f"removed {', '.join(remove_prefix(prefix))}")
    if not stale:
        _say("no namespaces of a killed lptrain-cluster were found")


def _cluster_text(plan: ClusterPlan, command: list[str], fidelity: Fidelity) -> str:
    """cluster.txt: the cluster as planned and as measured, the command, and every command
    that made it."""
    spec = plan.spec
    placement = ""
    if spec.layout == "racks":
        how = "node i in rack i % racks" if spec.placement == "interleaved" else "consecutive nodes in a rack"
        placement = f"placement: {spec.placement} ({how})\n"
    return (
        f"{plan.describe()}\nlinks: {plan.describe_links()}\n{placement}command: {' '.join(command)}\n"
        f"namespaces: {' '.join(plan.namespaces)}\n"
        + "".join(f"node {n.index}: {n.namespace} {n.address} rack {n.rack}\n" for n in plan.nodes)
        + f"{fidelity.summary()}\n"
        + "".join(line + "\n" for line in fidelity.lines())
        + "".join(" ".join(c) + "\n" for c in plan.commands)
    )


def _write_whole(path: Path, text: str) -> None:
    """Write ``path`` whole or not at all (a signal or a full disk leaves no half of it)."""
    part = path.with_name(path.name + ".part")
    try:
        part.write_text(text)
        os.replace(part, path)
    finally:
        part.unlink(missing_ok=True)


def _start(cluster: Cluster, args: argparse.Namespace, log_dir: Path, command: list[str], stop: Stop) -> Fidelity:
    """Make the cluster and check that the host carries it; on a refusal, an error or a
    signal, remove it again and exit with the cause in one line."""
    try:
        cluster.up()
        window_s = args.fidelity_window
        fidelity = fidelity_check.measure(cluster, warmup_s=min(fidelity_check.WARMUP_S, window_s), window_s=window_s)
    except BaseException as err:
        cluster.down()
        if isinstance(err, ClusterError):
            _fail(str(err))
        raise
    accepted = args.accept_low_fidelity
    try:
        _write_whole(log_dir / "cluster.txt", _cluster_text(cluster.plan, command, fidelity))
        _write_whole(log_dir / "fidelity.json", json.dumps(fidelity.to_json(accepted), indent=1) + "\n")
    except OSError as err:
        cluster.down()
        _fail(f"cannot write the cluster's description into {log_dir}: {err.strerror or err}")
    if stop.signum is not None:  # a signal while the links were made or checked: start nothing
        cluster.down()
        _fail(f"stopped by {signal.Signals(stop.signum).name} before the nodes started", 128 + stop.signum)
    if not fidelity.passed and not accepted:
        cluster.down()
        _fail(fidelity.refusal(), EXIT_LOW_FIDELITY)
    _say(fidelity.summary())
    if not fidelity.passed:
        _say(f"warning: below fidelity, run anyway ({ACCEPT_LOW_FIDELITY}): the times measured on this cluster "
             "are set by the host as much as by the links")  # fmt: skip
    return fidelity


def _report_usage(sampler: link_usage.LinkSampler, log_dir: Path) -> None:
    """``--link-usage``: each link's line printed and kept (links.txt), every reading (links.csv)
    and the picture (links.png) in the log folder."""
    if sampler.error:
        _say(f"link usage: {sampler.error}")
    lines = [u.line() for u in sampler.usage()]
    if sampler.cue is not None and sampler.cue_at is None:
        _say(f"link usage: rank 0 never printed {sampler.cue!r} (--link-usage-from): nothing counted")
    elif not lines:
        _say("link usage: no link carried traffic while the command ran")
    if not lines:
        return
    for line in lines:
        _say(f"link usage: {line}")
    try:
        _write_whole(log_dir / "links.txt", "".join(line + "\n" for line in lines))
        _write_whole(log_dir / "links.csv", sampler.csv_text())
        link_usage.write_figure(sampler, log_dir / "links.png")
    except OSError as err:
        _say(f"link usage: cannot write it into {log_dir}: {err.strerror or err}")


@quiet_on_closed_pipe
def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    if args.check:
        problem = privilege_problem()
        _say(problem or "network namespaces can be made here")
        sys.exit(EXIT_USAGE if problem else 0)
    if not args.clean:
        try:
            spec, command, link_down = _validated(args)
        except ClusterSpecError as err:
            _fail(str(err))
    if not has_net_admin():
        if os.environ.get(IN_USERNS) or not can_unshare_user():
            _fail(privilege_problem() or "CAP_NET_ADMIN is missing")
        if args.clean:
            _fail("--clean needs CAP_NET_ADMIN (root): a cluster made in a user namespace vanishes with it")
        _reexec_in_user_namespace(argv)
    if args.clean:
        _clean()
        return
    for prefix in stale_prefixes():
        _say(f"namespaces {prefix}-* were left by a killed lptrain-cluster; `lptrain-cluster --clean` removes them")
    log_dir = args.logs or default_log_dir()
    try:
        log_dir.mkdir(parents=True, exist_ok=args.logs is not None)
    except OSError as err:
        _fail(f"cannot make the log folder {log_dir}: {err.strerror or err}")
    plan = build_plan(spec, f"lpc{os.getpid()}", args.congestion or congestion_control(), args.egress)
    if os.environ.get(IN_USERNS):
        _private_mounts(plan)
    launch = Launch(
        command=command,
        log_dir=log_dir,
        nproc_per_node=args.nproc_per_node,
        timeout_s=args.timeout,
        grace_s=args.grace,
        stop_grace_s=args.stop_grace,
        link_down=link_down,
        echo=None if args.quiet else sys.stdout,
        say=_say,
        watch=link_usage.LinkSampler(plan, args.link_usage, args.link_usage_from) if args.link_usage else None,
    )
    _say(f"{plan.describe()}; {plan.describe_links()}; logs in {log_dir}")
    stop = Stop()
    stop.install()
    cluster = Cluster(plan)
    fidelity = _start(cluster, args, log_dir, command, stop)
    if args.fidelity_only:
        cluster.down()
        return
    outcome = run_on_cluster(cluster, launch, stop)
    if launch.watch is not None:
        _report_usage(launch.watch, log_dir)
    below = "" if fidelity.passed else "; the figures are below fidelity"
    _say(f"{outcome.reason} ({outcome.elapsed_s:.1f} s{below}); logs in {log_dir}")
    sys.exit(outcome.code)


if __name__ == "__main__":
    main()
