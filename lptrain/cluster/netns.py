"""Make an emulated cluster's namespaces and links, and remove every trace of them.

Everything ``Cluster`` adds is a named network namespace whose name starts with its
prefix (``lpc<pid>-``, the pid of the ``lptrain-cluster`` that made it); deleting a
namespace deletes the veth ends, bridges and queues inside it, so teardown is: end every
process still inside one of *our* namespaces (``ip netns pids`` lists exactly those), then
delete the namespaces, switch last. Nothing is matched by process name, and nothing
outside the prefix is touched.

Making namespaces needs CAP_NET_ADMIN: root, or a user namespace where the kernel lets
an ordinary user make one (``lptrain.cluster.cli`` then runs itself inside one, where the
namespaces are private to it and vanish with it).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from lptrain.cluster.plan import CONGESTION_CONTROL, NODE_IF, ClusterPlan

CAP_NET_ADMIN = 12
ETC_NETNS = Path("/etc/netns")
ALLOWED_CONGESTION = Path("/proc/sys/net/ipv4/tcp_allowed_congestion_control")
PREFIX_PATTERN = re.compile(r"^lpc(\d+)-")


class ClusterError(RuntimeError):
    """The emulated cluster could not be made, or a command on it failed."""


def has_net_admin() -> bool:
    """Whether this process may configure network namespaces (CAP_NET_ADMIN effective)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) >> CAP_NET_ADMIN & 1)
    except OSError:
        pass
    return os.geteuid() == 0


def can_unshare_user() -> bool:
    """Whether an ordinary user may make a user namespace with its own network (and mounts)."""
    try:
        done = subprocess.run(
            ["unshare", "--user", "--map-root-user", "--net", "--mount", "true"],
            capture_output=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def privilege_problem() -> str | None:
    """None where namespaces can be made here (as root, or in a user namespace), else why not."""
    if has_net_admin() or can_unshare_user():
        return None
    return (
        "an emulated cluster needs CAP_NET_ADMIN to make network namespaces: run it as root, or where "
        "the kernel lets users make user namespaces (sysctl kernel.unprivileged_userns_clone=1, "
        "user.max_user_namespaces > 0)"
    )


def congestion_control(wanted: str = CONGESTION_CONTROL) -> str | None:
    """``wanted`` where a namespace may choose it, else None: the namespaces then keep the
    default they inherit from the host's, and cluster.txt says so. (Outside the host's own
    namespace the kernel lets a namespace choose only what
    ``net.ipv4.tcp_allowed_congestion_control`` lists.)"""
    available = allowed_congestion()
    return wanted if available is not None and wanted in available else None


def allowed_congestion() -> list[str] | None:
    """The congestion controls a namespace other than the host's may choose
    (``net.ipv4.tcp_allowed_congestion_control``); None where that cannot be read."""
    try:
        return ALLOWED_CONGESTION.read_text().split()
    except OSError:
        return None


def run_ip(argv: Sequence[str]) -> None:
    """Run one ``ip``/``tc`` command; a failure names the command and what it printed."""
    done = subprocess.run(list(argv), capture_output=True, text=True)
    if done.returncode != 0:
        raise _failed(argv, (done.stderr or done.stdout).strip().splitlines(), done.returncode)


def _failed(command: Sequence[str], said: list[str], code: int) -> ClusterError:
    """One line: the command, and the last thing it printed (or its exit code)."""
    return ClusterError(f"`{' '.join(command)}` failed: {said[-1] if said else f'exit {code}'}")


# An argument ``tc -batch`` would read otherwise than ``tc`` does: its lines are split on
# blanks, quotes group words, and ``#`` starts a comment.
_NOT_BATCHABLE = re.compile(r"[\s'\"#\\]")


def tc_batches(commands: Sequence[Sequence[str]]) -> list[list[Sequence[str]]]:
    """``commands`` in order, in groups to run together: each run of consecutive ``tc -n NS``
    commands for one namespace is one group, every other command (and a ``tc`` command with
    an argument that a batch line would read differently) a group of its own."""
    groups: list[list[Sequence[str]]] = []
    for command in commands:
        last = groups[-1] if groups else None
        if last and _batchable(command) and _batchable(last[0]) and list(last[0][:3]) == list(command[:3]):
            last.append(command)
        else:
            groups.append([command])
    return groups


def _batchable(command: Sequence[str]) -> bool:
    return list(command[:2]) == ["tc", "-n"] and len(command) > 3 and not any(map(_NOT_BATCHABLE.search, command))


def run_commands(commands: Sequence[Sequence[str]]) -> None:
    """Run ``ip``/``tc`` commands in order, stopping at the first that fails (named as
    ``run_ip`` names it). A namespace's consecutive ``tc`` commands go to one ``tc -n NS
    -batch -``: per-pair queues make about 1,600 of them at P = 16 and 6,300 at P = 32, and
    one process each, about 2 ms apiece, was most of a cluster's start."""
    for group in tc_batches(commands):
        if len(group) == 1:
            run_ip(group[0])
            continue
        lines = "".join(" ".join(command[3:]) + "\n" for command in group)
        done = subprocess.run(["tc", "-n", group[0][2], "-batch", "-"], input=lines, capture_output=True, text=True)
        if done.returncode != 0:
            said = (done.stderr or done.stdout).strip().splitlines()
            failed = next((int(m[1]) for line in said if (m := re.fullmatch(r"Command failed -:(\d+)", line))), None)
            command = group[failed - 1] if failed and failed <= len(group) else ["tc", "-n", group[0][2], "-batch"]
            raise _failed(command, [line for line in said if not line.startswith("Command failed")], done.returncode)


def list_namespaces() -> list[str]:
    done = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    return [line.split()[0] for line in done.stdout.splitlines() if line.strip()]


def pids_in(namespace: str) -> list[int]:
    """The processes whose network namespace is ``namespace``."""
    done = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True)
    return [int(p) for p in done.stdout.split() if p.isdigit()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie is dead for our purpose: it holds no namespace and waits only for its parent
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def end_processes_in(namespaces: Sequence[str], grace_s: float = 3.0) -> list[int]:
    """SIGTERM, then after ``grace_s`` SIGKILL, every process inside ``namespaces``; the pids ended."""
    ended: list[int] = []
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        pids = [p for ns in namespaces for p in pids_in(ns) if _alive(p)]
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                continue
            ended.append(pid)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and any(_alive(p) for p in pids):
            time.sleep(0.05)
    return sorted(set(ended))


def stale_prefixes() -> list[str]:
    """Prefixes of lptrain-cluster namespaces whose maker is no longer running (a SIGKILL)."""
    stale = set()
    for name in list_namespaces():
        match = PREFIX_PATTERN.match(name)
        if match and not _maker_alive(int(match.group(1))):
            stale.add(f"lpc{match.group(1)}")
    return sorted(stale)


def _maker_alive(pid: int) -> bool:
    if not _alive(pid):
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return False
    return b"lptrain" in cmdline and b"cluster" in cmdline


def remove_prefix(prefix: str) -> list[str]:
    """Delete every namespace named ``prefix-*`` (ending the processes inside first)."""
    ours = [n for n in list_namespaces() if n.startswith(f"{prefix}-")]
    end_processes_in(ours)
    for name in sorted(ours, key=lambda n: n.endswith("-sw")):  # the switch last
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
        with contextlib.suppress(OSError):
            (ETC_NETNS / name / "hosts").unlink(missing_ok=True)
            (ETC_NETNS / name).rmdir()
    return ours


def hosts_text(plan: ClusterPlan) -> str:
    """Each node by name, under its IPv4 address and the IPv6 form of it that a dual-stack
    socket reports (torch's store looks the peer's name up and warns when none is found)."""
    lines = ["127.0.0.1 localhost", "::1 localhost"]
    for n in plan.nodes:
        lines += [f"{n.address} node{n.index}", f"::ffff:{n.address} node{n.index}"]
    return "\n".join(lines) + "\n"


class Cluster:
    """The namespaces and links of ``plan``, made on ``up()`` and removed on ``down()``.

    ``down()`` removes exactly the namespaces that ``up()`` added, also after ``up()``
    failed half-way, and may be called any number of times.
    """

    def __init__(self, plan: ClusterPlan, etc: Path = ETC_NETNS) -> None:
        self.plan = plan
        self.added: list[str] = []
        self.etc = etc
        self.written: list[Path] = []  # folders of per-namespace /etc files made by up()

    def up(self) -> None:
        existing = set(list_namespaces())
        clash = [n for n in self.plan.namespaces if n in existing]
        if clash:
            raise ClusterError(f"namespace {clash[0]} exists already; it was not made by this run and is left alone")
        for name in self.plan.namespaces:
            run_ip(["ip", "netns", "add", name])
            self.added.append(name)
        run_commands(self.plan.commands)
        self._write_hosts()

    def _write_hosts(self) -> None:
        """Name every node in each node's /etc/hosts (``ip netns exec`` mounts
        ``/etc/netns/NAME/hosts`` there), so that looking up a peer's address finds a name.
        Skipped where /etc/netns cannot be written (a user namespace: see ``hosts_text``)."""
        try:
            if not self.etc.exists():
                self.etc.mkdir()
                self.written.append(self.etc)
            for node in self.plan.nodes:
                folder = self.etc / node.namespace
                folder.mkdir()
                self.written.append(folder)
                (folder / "hosts").write_text(hosts_text(self.plan))
        except OSError:
            return

    def down(self) -> list[int]:
        """End the processes left inside the namespaces, then delete them; the pids ended."""
        ended = end_processes_in(self.added)
        for name in [n for n in self.added if n != self.plan.switch] + [n for n in self.added if n == self.plan.switch]:
            done = subprocess.run(["ip", "netns", "del", name], capture_output=True, text=True)
            if done.returncode != 0 and name in list_namespaces():
                raise ClusterError(f"could not delete namespace {name}: {done.stderr.strip()}")
        self.added.clear()
        for folder in reversed(self.written):  # what up() made, and nothing else
            with contextlib.suppress(OSError):
                (folder / "hosts").unlink(missing_ok=True)
                folder.rmdir()
        self.written.clear()
        return ended

    def exec_prefix(self, node: int) -> list[str]:
        """The argv prefix that runs a command inside node ``node``'s namespace."""
        return ["ip", "netns", "exec", self.plan.nodes[node].namespace]

    def set_link(self, node: int, up: bool) -> None:
        """Take node ``node``'s port down (a cable pulled) or bring it back."""
        run_ip(["ip", "-n", self.plan.nodes[node].namespace, "link", "set", NODE_IF, "up" if up else "down"])

    def set_rate(self, node: int, bits: int) -> None:
        """Change node ``node``'s port rate in both directions while the cluster runs."""
        run_commands(
            [c for shaping in self.plan.port_shaping(node, bits) for c in [shaping.clear(), *shaping.commands()]]
        )
