#!/bin/sh
# A base image for deploy/Dockerfile made from Debian's packages, for a host that reaches Debian's
# archive but no image registry. As root, from the repository root:
#
#     sh deploy/image/debian-base.sh localhost/execbox-runner-base:bookworm
#     podman build --format docker -f deploy/Dockerfile \
#         --build-arg PYTHON_IMAGE=localhost/execbox-runner-base:bookworm -t localhost/execbox-runner:0.2.0 .
#
# The image holds Debian's Python 3 and what it depends on, without documentation or translations
# (the copyright files stay). The Dockerfile's build stage adds the compiler, the headers and venv
# from Debian's archive itself, so the final image has none of them. Needs mmdebstrap and podman.
set -eu
image=${1:-localhost/execbox-runner-base:bookworm}
suite=${2:-bookworm}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mmdebstrap --quiet --variant=minbase --include=python3 \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    "$suite" "$work/rootfs.tar" \
    "deb $mirror/debian $suite main" \
    "deb $mirror/debian $suite-updates main" \
    "deb $mirror/debian-security $suite-security main"
podman import --quiet \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["python3"]' \
    "$work/rootfs.tar" "$image" >/dev/null
echo "$image"
