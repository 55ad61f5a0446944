#!/usr/bin/env python3
"""Turn the docker-archive `buildah push` writes (stdin) into an OCI-layout archive for
`ctr images import` (stdout) that leaves out the layers the node already holds.

    slim_archive.py IMAGE_NAME PRESENT_DIGESTS_FILE < docker-archive > oci-archive

Why: containerd reads a docker-archive layer to learn its digest, so importing an image
whose code layer changed also writes out its unchanged torch layer (about 30 s of a
learner image's 45). An OCI archive names each blob by its digest up front; a layer that
is left out is taken from the node's content store, where an earlier import of the same
uncompressed layer left it under the same digest. If containerd lacks one after all, the
import fails and the caller imports the full archive instead.

Both streams are read and written in one pass (`r|`/`w|`), never held on disk.
"""

from __future__ import annotations

import hashlib
import io
import json
import sys
import tarfile

DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_CONFIG = "application/vnd.docker.container.image.v1+json"
DOCKER_LAYER = "application/vnd.docker.image.rootfs.diff.tar"


def _add(out: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o444
    out.addfile(info, io.BytesIO(data))


def _blob(out: tarfile.TarFile, data: bytes) -> dict:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    _add(out, "blobs/sha256/" + digest.split(":")[1], data)
    return {"digest": digest, "size": len(data)}


def slim(image: str, present: set[str], src: tarfile.TarFile, out: tarfile.TarFile) -> list[str]:
    """Copy src's layers that are not in `present` into out as OCI blobs, then the config,
    a manifest naming every layer and an index naming the image. Returns the digests left
    out."""
    sizes: dict[str, int] = {}  # layer file name -> its size, kept or not
    small: dict[str, bytes] = {}  # manifest.json and the config
    skipped = []
    for member in src:
        name = member.name
        if member.isfile() and "/" not in name and name.endswith(".tar"):
            digest = "sha256:" + name[: -len(".tar")]
            sizes[name] = member.size
            if digest in present:
                skipped.append(digest)
                continue  # a stream tar skips the member's bytes on the next read
            info = tarfile.TarInfo("blobs/sha256/" + digest.split(":")[1])
            info.size, info.mode = member.size, 0o444
            out.addfile(info, src.extractfile(member))
        elif member.isfile() and "/" not in name and name.endswith(".json"):
            small[name] = src.extractfile(member).read()
    manifests = json.loads(small["manifest.json"])
    if len(manifests) != 1:
        raise SystemExit(f"slim_archive: expected one image in the archive, got {len(manifests)}")
    entry = manifests[0]
    config = small[entry["Config"]]
    layers = [{"mediaType": DOCKER_LAYER, "digest": "sha256:" + layer[: -len(".tar")],
               "size": sizes[layer]} for layer in entry["Layers"]]
    config_blob = {"mediaType": DOCKER_CONFIG, **_blob(out, config)}
    manifest = json.dumps({"schemaVersion": 2, "mediaType": DOCKER_MANIFEST,
                           "config": config_blob, "layers": layers}).encode()
    tag = image.rsplit(":", 1)[1] if ":" in image.rsplit("/", 1)[-1] else "latest"
    index = {"schemaVersion": 2, "manifests": [{
        "mediaType": DOCKER_MANIFEST, **_blob(out, manifest),
        "annotations": {"io.containerd.image.name": image,
                        "org.opencontainers.image.ref.name": tag}}]}
    _add(out, "oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
    _add(out, "index.json", json.dumps(index).encode())
    return skipped


def main() -> None:
    if len(sys.argv) != 3:
        raise SystemExit("usage: slim_archive.py IMAGE_NAME PRESENT_DIGESTS_FILE")
    image, present_file = sys.argv[1:]
    with open(present_file) as f:
        present = {line.split()[0] for line in f if line.startswith("sha256:")}
    with tarfile.open(fileobj=sys.stdin.buffer, mode="r|") as src, \
            tarfile.open(fileobj=sys.stdout.buffer, mode="w|", format=tarfile.PAX_FORMAT) as out:
        skipped = slim(image, present, src, out)
    print(f"[slim_archive] {image}: {len(skipped)} layer(s) already in the node", file=sys.stderr)


if __name__ == "__main__":
    main()
