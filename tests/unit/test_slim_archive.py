"""scripts/k8s/slim_archive.py: a docker-archive in, an OCI archive out that carries every
layer the node lacks, names every layer in its manifest, and names the image for `ctr
images import`. (The import itself is exercised by the in-cluster test's reload.)"""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "k8s" / "slim_archive.py"
IMAGE = "localhost/rlfleet-env:0.1.0"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def docker_archive(layers: list[bytes]) -> tuple[bytes, bytes]:
    """A docker-archive laid out as buildah writes one: layers named by their digest, the
    config, per-layer folders with a symlink, then manifest.json."""
    config = json.dumps({"architecture": "amd64", "os": "linux", "rootfs": {
        "type": "layers", "diff_ids": [f"sha256:{sha(x)}" for x in layers]}}).encode()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        def add(name: str, data: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))

        for layer in layers:
            add(f"{sha(layer)}.tar", layer)
        add(f"{sha(config)}.json", config)
        link = tarfile.TarInfo(f"{sha(layers[0])[:12]}/layer.tar")
        link.type, link.linkname = tarfile.SYMTYPE, f"../{sha(layers[0])}.tar"
        tar.addfile(link)
        add("manifest.json", json.dumps([{"Config": f"{sha(config)}.json", "RepoTags": [IMAGE],
                                          "Layers": [f"{sha(x)}.tar" for x in layers]}]).encode())
    return buf.getvalue(), config


def slim(archive: bytes, present: list[str], tmp_path: Path) -> tuple[dict[str, bytes], str]:
    digests = tmp_path / "digests"
    digests.write_text("".join(f"{d}\n" for d in present))
    out = subprocess.run([sys.executable, str(SCRIPT), IMAGE, str(digests)], input=archive,
                         capture_output=True, timeout=60)
    assert out.returncode == 0, out.stderr.decode()
    with tarfile.open(fileobj=io.BytesIO(out.stdout)) as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}
    return files, out.stderr.decode()


def test_layers_the_node_holds_are_left_out_and_still_named(tmp_path: Path) -> None:
    base, code = b"torch " * 5000, b"rlfleet code"
    archive, config = docker_archive([base, code])
    files, said = slim(archive, [f"sha256:{sha(base)}"], tmp_path)

    assert f"blobs/sha256/{sha(base)}" not in files
    assert files[f"blobs/sha256/{sha(code)}"] == code
    assert files[f"blobs/sha256/{sha(config)}"] == config
    assert json.loads(files["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    [entry] = json.loads(files["index.json"])["manifests"]
    assert entry["annotations"]["io.containerd.image.name"] == IMAGE
    assert entry["annotations"]["org.opencontainers.image.ref.name"] == "0.1.0"
    manifest_bytes = files[f"blobs/sha256/{entry['digest'].split(':')[1]}"]
    assert sha(manifest_bytes) == entry["digest"].split(":")[1]
    assert entry["size"] == len(manifest_bytes)
    manifest = json.loads(manifest_bytes)
    assert manifest["config"]["digest"] == f"sha256:{sha(config)}"
    # every layer, in order, by the digest and size the node holds it under
    assert [(x["digest"], x["size"]) for x in manifest["layers"]] == [
        (f"sha256:{sha(base)}", len(base)), (f"sha256:{sha(code)}", len(code))]
    assert "1 layer(s) already in the node" in said


def test_with_nothing_in_the_node_every_layer_crosses(tmp_path: Path) -> None:
    layers = [b"a" * 700, b"b" * 1300]
    archive, _ = docker_archive(layers)
    files, said = slim(archive, [], tmp_path)
    assert all(files[f"blobs/sha256/{sha(x)}"] == x for x in layers)
    assert "0 layer(s) already in the node" in said


def test_an_archive_of_two_images_is_refused(tmp_path: Path) -> None:
    archive, _ = docker_archive([b"x"])
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        members = {m.name: (m, tar.extractfile(m).read() if m.isfile() else None) for m in tar}
    doubled = json.loads(members["manifest.json"][1]) * 2
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, (info, data) in members.items():
            if name == "manifest.json":
                data = json.dumps(doubled).encode()
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    digests = tmp_path / "digests"
    digests.write_text("")
    out = subprocess.run([sys.executable, str(SCRIPT), IMAGE, str(digests)],
                         input=buf.getvalue(), capture_output=True, timeout=60)
    assert out.returncode != 0
    assert b"expected one image in the archive, got 2" in out.stderr
