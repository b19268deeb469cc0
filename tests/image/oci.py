#!/usr/bin/env python3
"""Builds and unpacks Pilothouse's OCI image archive with nothing but the Python standard library.

build:  an OCI image layout (oci-layout, index.json, blobs/sha256/...) in one tar, loadable by
        `podman load`, `docker load` (25+), `skopeo copy oci-archive:...` or `ctr image import`.
        One layer per platform: the binary at /usr/bin/pilothouse, exactly the shared libraries
        `ldd` says it loads (none for a static binary), and /etc/passwd and /etc/group naming the
        non-root user 65532. Reproducible: fixed times and owners, sorted entries.
run:    unpacks an archive and runs its entrypoint the way a kubelet would with the chart's pod
        spec: in a new mount namespace, the root file system bind-mounted read-only, the service
        account token directory mounted at /var/run/secrets/kubernetes.io/serviceaccount, as the
        image's user, with only the image's environment (plus --env), args replacing Cmd. Root only
        (chroot and mounts); the process execs in place, so its PID is the caller's child's.
unpack: applies an archive's layers (for one platform) to a directory and prints the image
        config (Entrypoint, Cmd, Env, User, WorkingDir) as JSON, so a test can run the entrypoint
        as the image's user with the image's environment.
"""
import argparse
import gzip
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile

USER = 65532
EPOCH = int(os.environ.get("SOURCE_DATE_EPOCH", "0"))
ENTRYPOINT = "/usr/bin/pilothouse"
ELF_MACHINES = {62: "amd64", 183: "arm64"}
MT_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MT_INDEX = "application/vnd.oci.image.index.v1+json"
MT_CONFIG = "application/vnd.oci.image.config.v1+json"
MT_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"


def elf_arch(path):
    with open(path, "rb") as f:
        head = f.read(20)
    if head[:4] != b"\x7fELF":
        sys.exit(f"{path} is not an ELF binary")
    machine = int.from_bytes(head[18:20], "little")
    if machine not in ELF_MACHINES:
        sys.exit(f"{path}: unsupported ELF machine {machine}")
    return ELF_MACHINES[machine]


def shared_libraries(binary):
    """The files the dynamic loader maps for `binary`: [] for a static binary."""
    out = subprocess.run(["ldd", binary], capture_output=True, text=True)
    text = out.stdout + out.stderr
    if "not a dynamic executable" in text or "statically linked" in text:
        return []
    if out.returncode != 0:
        sys.exit(f"ldd {binary} failed: {text}")
    libs = []
    for line in text.splitlines():
        line = line.strip()
        if "=>" in line:
            target = line.split("=>", 1)[1].strip().split(" ")[0]
            if target == "not":
                sys.exit(f"{binary}: a library is missing: {line}")
            if target.startswith("/"):
                libs.append(target)
        elif line.startswith("/"):  # the loader itself, e.g. /lib64/ld-linux-x86-64.so.2
            libs.append(line.split(" ")[0])
    return sorted(set(libs))


def add_dirs(tar, path, seen):
    parts = path.strip("/").split("/")[:-1]
    for i in range(1, len(parts) + 1):
        d = "/".join(parts[:i])
        if d not in seen:
            seen.add(d)
            info = tarfile.TarInfo(d)
            info.type = tarfile.DIRTYPE
            info.mode = 0o755
            info.mtime = EPOCH
            tar.addfile(info)


def add_file(tar, path, data, mode, seen):
    add_dirs(tar, path, seen)
    info = tarfile.TarInfo(path.lstrip("/"))
    info.size = len(data)
    info.mode = mode
    info.mtime = EPOCH
    tar.addfile(info, io.BytesIO(data))


def layer_for(binary):
    """(uncompressed layer tar bytes, list of library paths)."""
    files = {}
    with open(binary, "rb") as f:
        files[ENTRYPOINT] = (f.read(), 0o755)
    libs = shared_libraries(binary)
    for lib in libs:
        with open(os.path.realpath(lib), "rb") as f:
            files[lib] = (f.read(), 0o755)
    files["/etc/passwd"] = (
        f"root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:{USER}:{USER}:nonroot:/home/nonroot:/sbin/nologin\n".encode(),
        0o644,
    )
    files["/etc/group"] = (f"root:x:0:\nnonroot:x:{USER}:\n".encode(), 0o644)
    buf = io.BytesIO()
    seen = set()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        # The home directory exists (owned by the user) but nothing else is writable: the image
        # runs with a read-only root file system.
        info = tarfile.TarInfo("home")
        info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, EPOCH
        tar.addfile(info)
        seen.add("home")
        info = tarfile.TarInfo("home/nonroot")
        info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o700, EPOCH
        info.uid = info.gid = USER
        tar.addfile(info)
        seen.add("home/nonroot")
        for path in sorted(files):
            data, mode = files[path]
            add_file(tar, path, data, mode, seen)
    return buf.getvalue(), libs


def blob(out, data, media_type):
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    out[f"blobs/sha256/{digest[7:]}"] = data
    return {"mediaType": media_type, "digest": digest, "size": len(data)}


def version_of_workspace():
    """The workspace's version (Cargo.toml [workspace.package]): the binary is never run here, so
    a foreign-architecture binary builds too and nothing can reach a cluster."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    section = None
    with open(os.path.join(root, "Cargo.toml")) as f:
        for line in f:
            line = line.strip()
            if line.startswith("["):
                section = line
            elif section == "[workspace.package]" and line.startswith("version"):
                return line.split("=", 1)[1].strip().strip('"')
    return "unknown"


def build(args):
    out = {}
    manifests = []
    arches = set()
    for binary in args.binary:
        arch = elf_arch(binary)
        if arch in arches:
            sys.exit(f"two binaries for {arch}")
        arches.add(arch)
        layer, libs = layer_for(binary)
        gz = io.BytesIO()
        with gzip.GzipFile(fileobj=gz, mode="wb", mtime=0, compresslevel=6) as g:
            g.write(layer)
        layer_desc = blob(out, gz.getvalue(), MT_LAYER)
        config = {
            "architecture": arch,
            "os": "linux",
            "created": "1970-01-01T00:00:00Z",
            "config": {
                "User": f"{USER}:{USER}",
                "Entrypoint": [ENTRYPOINT],
                "Cmd": ["--logging-format=json"],
                "Env": ["PATH=/usr/bin", "HOME=/home/nonroot"],
                "WorkingDir": "/",
                "ExposedPorts": {"10257/tcp": {}},
                "Labels": {
                    "org.opencontainers.image.title": "pilothouse",
                    "org.opencontainers.image.version": version_of_workspace(),
                    "org.opencontainers.image.licenses": "Apache-2.0",
                },
            },
            "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(layer).hexdigest()]},
            "history": [{
                "created": "1970-01-01T00:00:00Z",
                "created_by": "tests/image/build: pilothouse binary"
                + (", " + ", ".join(libs) if libs else " (static)")
                + ", /etc/passwd, /etc/group",
            }],
        }
        config_desc = blob(out, json.dumps(config, sort_keys=True).encode(), MT_CONFIG)
        manifest = {"schemaVersion": 2, "mediaType": MT_MANIFEST, "config": config_desc, "layers": [layer_desc]}
        desc = blob(out, json.dumps(manifest, sort_keys=True).encode(), MT_MANIFEST)
        desc["platform"] = {"architecture": arch, "os": "linux"}
        manifests.append(desc)
        print(f"{arch}: {binary} + {len(libs)} libraries: {' '.join(libs) or '(static)'}", file=sys.stderr)
    annotations = {"org.opencontainers.image.ref.name": args.tag.rsplit(":", 1)[-1] if ":" in args.tag else "latest",
                   "io.containerd.image.name": args.tag}
    if len(manifests) == 1:
        top = dict(manifests[0], annotations=annotations)
    else:
        inner = {"schemaVersion": 2, "mediaType": MT_INDEX, "manifests": manifests}
        top = dict(blob(out, json.dumps(inner, sort_keys=True).encode(), MT_INDEX), annotations=annotations)
    out["oci-layout"] = json.dumps({"imageLayoutVersion": "1.0.0"}).encode()
    out["index.json"] = json.dumps({"schemaVersion": 2, "mediaType": MT_INDEX, "manifests": [top]}, sort_keys=True).encode()
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    tmp = args.output + ".partial"
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
        for d in ("blobs", "blobs/sha256"):
            info = tarfile.TarInfo(d)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, EPOCH
            tar.addfile(info)
        for path in sorted(out):
            info = tarfile.TarInfo(path)
            info.size, info.mode, info.mtime = len(out[path]), 0o644, EPOCH
            tar.addfile(info, io.BytesIO(out[path]))
    os.replace(tmp, args.output)
    print(args.output)


def read_blob(tar, desc):
    data = tar.extractfile("blobs/sha256/" + desc["digest"].split(":", 1)[1]).read()
    if "sha256:" + hashlib.sha256(data).hexdigest() != desc["digest"]:
        sys.exit(f"blob {desc['digest']} does not match its digest")
    return data


def unpack(args):
    with tarfile.open(args.archive) as tar:
        index = json.loads(tar.extractfile("index.json").read())
        desc = index["manifests"][0]
        while desc["mediaType"] == MT_INDEX:
            inner = json.loads(read_blob(tar, desc))
            found = [m for m in inner["manifests"] if m.get("platform", {}).get("architecture") == args.arch]
            if not found:
                sys.exit(f"no {args.arch} image in {args.archive}")
            desc = found[0]
        manifest = json.loads(read_blob(tar, desc))
        config = json.loads(read_blob(tar, manifest["config"]))
        if config["architecture"] != args.arch:
            sys.exit(f"the image is for {config['architecture']}, not {args.arch}")
        os.makedirs(args.dir, exist_ok=True)
        for i, layer in enumerate(manifest["layers"]):
            data = read_blob(tar, layer)
            raw = gzip.decompress(data) if layer["mediaType"].endswith("+gzip") else data
            want = config["rootfs"]["diff_ids"][i]
            if "sha256:" + hashlib.sha256(raw).hexdigest() != want:
                sys.exit(f"layer {i} does not match its diff_id")
            with tarfile.open(fileobj=io.BytesIO(raw)) as lt:
                for m in lt.getmembers():
                    if m.name.startswith("/") or ".." in m.name.split("/"):
                        sys.exit(f"unsafe path in layer: {m.name}")
                    if os.path.basename(m.name).startswith(".wh."):
                        sys.exit("whiteouts are not supported (the image has one layer)")
                kw = {"filter": "fully_trusted"} if hasattr(tarfile, "fully_trusted_filter") else {}
                lt.extractall(args.dir, numeric_owner=True, **kw)
    json.dump(config["config"], sys.stdout, sort_keys=True)
    print()


SA_DIR = "var/run/secrets/kubernetes.io/serviceaccount"

# Runs inside `unshare --mount`: read-only root, secrets mounted, a check that the root really is
# read-only, then chroot as the image's user with only the given environment.
RUN_SCRIPT = r"""
set -eu
root=$1 secrets=$2 user=$3; shift 3
mount --make-rprivate /
mount --bind "$root" "$root"
if [ -n "$secrets" ]; then
  mount --bind "$secrets" "$root/$SA_DIR"
  mount -o remount,bind,ro "$root/$SA_DIR"
fi
mount -o remount,bind,ro "$root"
if touch "$root/.read-only-check" 2>/dev/null; then
  echo "oci.py run: the root file system is writable; refusing to run" >&2
  exit 1
fi
exec "$@"
"""


def run(args):
    import shutil
    if os.geteuid() != 0:
        sys.exit("oci.py run needs root (a mount namespace and chroot)")
    if os.path.exists(args.dir):
        shutil.rmtree(args.dir)
    buf = io.StringIO()
    saved, sys.stdout = sys.stdout, buf
    try:
        unpack(args)
    finally:
        sys.stdout = saved
    config = json.loads(buf.getvalue())
    os.makedirs(os.path.join(args.dir, SA_DIR), exist_ok=True)
    user = config.get("User") or "0:0"
    if ":" not in user:
        user = f"{user}:{user}"
    argv = list(config.get("Entrypoint") or []) + (args.args if args.args else list(config.get("Cmd") or []))
    env = list(config.get("Env") or []) + list(args.env or [])
    chroot = shutil.which("chroot") or "/usr/sbin/chroot"
    cmd = ["env", "-i"] + env + [chroot, f"--userspec={user}", f"--groups={user.split(':')[1]}", os.path.abspath(args.dir)] + argv
    os.environ["SA_DIR"] = SA_DIR
    os.execvp("unshare", ["unshare", "--mount", "sh", "-c", RUN_SCRIPT, "sh",
                          os.path.abspath(args.dir), os.path.abspath(args.secrets) if args.secrets else "", user] + cmd)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("--binary", action="append", required=True, help="a pilothouse binary (repeat for each architecture)")
    b.add_argument("--output", required=True)
    b.add_argument("--tag", default="pilothouse:dev")
    u = sub.add_parser("unpack")
    u.add_argument("--archive", required=True)
    u.add_argument("--dir", required=True)
    u.add_argument("--arch", default=ELF_MACHINES.get({"x86_64": 62, "aarch64": 183}.get(os.uname().machine, 0), "amd64"))
    r = sub.add_parser("run")
    r.add_argument("--archive", required=True)
    r.add_argument("--dir", required=True, help="where to unpack (replaced)")
    r.add_argument("--secrets", help="a directory with token, ca.crt and namespace")
    r.add_argument("--env", action="append", help="K=V added to the image's environment")
    r.add_argument("--arch", default=u.get_default("arch"))
    r.add_argument("args", nargs="*", help="replace the image's Cmd (after --)")
    args = p.parse_args()
    {"build": build, "unpack": unpack, "run": run}[args.cmd](args)


if __name__ == "__main__":
    main()
