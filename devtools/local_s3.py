"""A real S3 server on this machine: Ceph's RADOS Gateway over a one-monitor, one-OSD cluster (memstore, no
auth between the daemons), every daemon on 127.0.0.1. The tests' fixture, the object-store benchmark and the
README's "On object storage" session start it here.

    eval "$(python -m devtools.local_s3 start --dir /tmp/rgw)"   # prints the AWS_* variables to export
    python -m devtools.local_s3 stop --dir /tmp/rgw

Two settings without which it hangs or is slow (found by `../shared/research/object_storage_probe.py`):
`ms mon client mode = crc secure` (the default asks for a secure mode the monitor was not set up for) and
`tcp_nodelay=1` on the beast frontend (40 ms per small request without it). Debian's packages `radosgw`,
`ceph-mon` and `ceph-osd` provide the daemons (`make test` installs them).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import asdict, dataclass, field

HOST = "127.0.0.1"
ACCESS_KEY = "metatable"
SECRET_KEY = "metatable-secret"
REGION = "us-east-1"
TOOLS = ("ceph-mon", "ceph-osd", "radosgw", "radosgw-admin", "ceph", "monmaptool", "ceph-authtool")
STATE = "server.json"
_children: dict[int, subprocess.Popen] = {}  # daemons this process started: waited for when stopped

CEPH_CONF = """[global]
fsid = {fsid}
mon host = [v2:{host}:{mon2},v1:{host}:{mon1}]
mon initial members = a
public addr = {host}
auth cluster required = none
auth service required = none
auth client required = none
ms mon client mode = crc secure
ms client mode = crc secure
ms bind ipv6 = false
osd pool default size = 1
osd pool default min size = 1
mon allow pool size one = true
osd crush chooseleaf type = 0
osd pool default pg autoscale mode = off
osd pool default pg num = 8
osd pool default pgp num = 8
mon warn on pool no redundancy = false
mon max pg per osd = 1000
run dir = {d}/run
log file = {d}/log/$name.log
admin socket = {d}/run/$name.asok
pid file = {d}/run/$name.pid
mon data = {d}/$name
osd data = {d}/$name
osd objectstore = memstore
memstore device bytes = {memory}
keyring = {d}/keyring
[client.rgw.a]
rgw frontends = beast endpoint={host}:{rgw} tcp_nodelay=1
rgw data = {d}/rgw
"""


@dataclass
class Server:
    """A running RGW: where it answers, its credentials, and the daemons to stop (monitor first started, last
    stopped)."""

    workdir: str
    endpoint: str = ""
    port: int = 0
    pids: dict[str, int] = field(default_factory=dict)
    conf: str = ""

    @property
    def environment(self) -> dict[str, str]:
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": ACCESS_KEY,
                "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_REGION": REGION, "AWS_ALLOW_HTTP": "true"}

    @property
    def storage_options(self) -> dict[str, str]:
        return {"endpoint": self.endpoint, "access_key_id": ACCESS_KEY, "secret_access_key": SECRET_KEY,
                "region": REGION}

    def save(self) -> None:
        with open(os.path.join(self.workdir, STATE), "w") as f:
            json.dump(asdict(self), f)

    @classmethod
    def load(cls, workdir: str) -> Server:
        with open(os.path.join(workdir, STATE)) as f:
            return cls(**json.load(f))

    def stop_gateway(self) -> None:
        """Kill the gateway alone (SIGKILL): the objects stay in the OSD, and `start_gateway` serves them again."""
        pid = self.pids.pop("radosgw", None)
        if pid:
            _kill(pid, signal.SIGKILL)
        self.save()

    def start_gateway(self) -> None:
        self.pids["radosgw"] = _daemon(self.workdir, "radosgw", "-c", self.conf, "-n", "client.rgw.a", "-f")
        _wait_http(self.port, 120, self.pids["radosgw"])
        self.save()

    def stop(self, remove: bool = True) -> None:
        for name in ("radosgw", "ceph-osd", "ceph-mon"):
            pid = self.pids.pop(name, None)
            if pid:
                _kill(pid, signal.SIGTERM)
        if remove:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def create_bucket(self, name: str) -> None:
        create_bucket(self.storage_options, name)


def create_bucket(storage_options: dict[str, str], name: str) -> None:
    """A bucket on the server the options name (obstore cannot create one: boto3 does)."""
    import boto3
    s3 = boto3.client("s3", endpoint_url=storage_options["endpoint"],
                      aws_access_key_id=storage_options["access_key_id"],
                      aws_secret_access_key=storage_options["secret_access_key"],
                      region_name=storage_options.get("region", REGION))
    try:
        s3.create_bucket(Bucket=name)
    except (s3.exceptions.BucketAlreadyOwnedByYou, s3.exceptions.BucketAlreadyExists):
        pass


def missing_tools() -> list[str]:
    return [tool for tool in TOOLS if not shutil.which(tool)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def start(workdir: str | None = None, memory_bytes: int = 4 << 30) -> Server:
    """Bootstrap a cluster in `workdir` (a new temporary directory by default) and start the gateway; about
    15 s. The OSD keeps objects in memory (`memory_bytes`, allocated as used)."""
    if missing_tools():
        raise FileNotFoundError(f"{', '.join(missing_tools())} not found: apt-get install radosgw ceph-mon ceph-osd "
                                "(make test installs them)")
    workdir = workdir or tempfile.mkdtemp(prefix="metatable-rgw-")
    for sub in ("mon.a", "osd.0", "run", "log", "rgw"):
        os.makedirs(os.path.join(workdir, sub), exist_ok=True)
    port = free_port()
    server = Server(workdir, f"http://{HOST}:{port}", port, conf=os.path.join(workdir, "ceph.conf"))
    try:
        fsid, mon2, mon1 = str(uuid.uuid4()), free_port(), free_port()
        with open(server.conf, "w") as f:
            f.write(CEPH_CONF.format(fsid=fsid, host=HOST, mon2=mon2, mon1=mon1, rgw=port, d=workdir,
                                     memory=memory_bytes))
        keyring, monmap = os.path.join(workdir, "keyring"), os.path.join(workdir, "monmap")
        _run("ceph-authtool", "--create-keyring", keyring, "--gen-key", "-n", "mon.", "--cap", "mon", "allow *")
        _run("monmaptool", "--create", "--addv", "a", f"[v2:{HOST}:{mon2},v1:{HOST}:{mon1}]", "--fsid", fsid, monmap)
        _run("ceph-mon", "-c", server.conf, "--mkfs", "-i", "a", "--monmap", monmap, "--keyring", keyring)
        server.pids["ceph-mon"] = _daemon(workdir, "ceph-mon", "-c", server.conf, "-i", "a", "-f")
        server.save()
        _run("ceph", "-c", server.conf, "status")
        osd_uuid = str(uuid.uuid4())
        osd = _run("ceph", "-c", server.conf, "osd", "new", osd_uuid).strip()
        _run("ceph-osd", "-c", server.conf, "-i", osd, "--mkfs", "--osd-uuid", osd_uuid)
        server.pids["ceph-osd"] = _daemon(workdir, "ceph-osd", "-c", server.conf, "-i", osd, "-f")
        server.save()
        deadline = time.monotonic() + 60
        while '"num_up_osds": 1' not in _run("ceph", "-c", server.conf, "osd", "stat", "-f", "json-pretty"):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the Ceph OSD did not come up; see {workdir}/log")
            time.sleep(0.5)
        server.start_gateway()
        _run("radosgw-admin", "-c", server.conf, "user", "create", "--uid=metatable", "--display-name=metatable",
             f"--access-key={ACCESS_KEY}", f"--secret={SECRET_KEY}", timeout=120)
        return server
    except BaseException:
        server.stop()
        raise


def _run(*command: str, timeout: float = 60) -> str:
    done = subprocess.run(list(command), capture_output=True, text=True, timeout=timeout)
    if done.returncode:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    return done.stdout


def _daemon(workdir: str, *command: str) -> int:
    with open(os.path.join(workdir, "log", f"{command[0]}.stdout"), "ab") as out:
        process = subprocess.Popen(list(command), stdout=out, stderr=out, stdin=subprocess.DEVNULL,
                                   start_new_session=True)
    _children[process.pid] = process
    return process.pid


def _kill(pid: int, sig: int) -> None:
    """Signal a daemon and wait for it to go (SIGKILL after 15 s): one of this process's, or one an earlier
    `start` command left running."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return
    process = _children.pop(pid, None)
    if process is not None:
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)
        return
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _wait_http(port: int, timeout_s: float, pid: int) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://{HOST}:{port}/", timeout=1)
            return
        except urllib.error.HTTPError:  # an S3 error answer: it is up
            return
        except OSError:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                raise RuntimeError(f"radosgw exited before answering on {HOST}:{port}") from None
            time.sleep(0.2)
    raise RuntimeError(f"radosgw did not answer on {HOST}:{port} within {timeout_s}s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.local_s3", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("start", help="start a local RGW and print the AWS_* variables to export")
    up.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "metatable-rgw"))
    up.add_argument("--bucket", default="lake", help="a bucket to create (default: lake)")
    up.add_argument("--memory-gib", type=float, default=4.0)
    down = sub.add_parser("stop", help="stop the RGW started with the same --dir and delete its data")
    down.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "metatable-rgw"))
    args = parser.parse_args(argv)
    if args.command == "stop":
        if os.path.exists(os.path.join(args.dir, STATE)):
            Server.load(args.dir).stop()
        return 0
    if os.path.exists(os.path.join(args.dir, STATE)):
        Server.load(args.dir).stop()
    server = start(args.dir, int(args.memory_gib * (1 << 30)))
    server.create_bucket(args.bucket)
    for name, value in server.environment.items():
        print(f"export {name}={value}")
    print(f"# bucket s3://{args.bucket} on {server.endpoint}; stop with: python -m devtools.local_s3 stop --dir "
          f"{args.dir}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
