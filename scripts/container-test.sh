#!/usr/bin/env bash
# The image built and the compose stack started for real (docs/deploy.md, "CI"):
#   scripts/container-test.sh [--host-ca]
# 1. a container engine: docker when its daemon answers, else podman (installed with
#    runc and mmdebstrap when missing, and configured where this machine needs it);
#    CONTAINER_ENGINE=docker with a client but no daemon starts dockerd for the run;
# 2. the base images, made locally from Debian packages by mmdebstrap (no container
#    registry is needed), cached under .cache/containers (or $TRIMPROXY_TEST_CACHE/
#    containers, as the unit tests' cache) by the hash of their recipe;
# 3. docker/Dockerfile built on that base (--host-ca: the host's CA bundle passed as the
#    build secret host-ca, for networks that inspect TLS; no layer keeps it);
# 4. the checks: tests/deploy/containers (pytest -m container): the image run locked
#    down, then deploy/compose up with deploy/compose/compose.ci.yaml's stand-ins.
# CONTAINER_ENGINE=docker|podman picks the engine; the unit tests' .venv runs pytest.
set -euo pipefail
# A failure inside $(...) (base_image) stops the script too.
shopt -s inherit_errexit
cd "$(dirname "$0")/.."
ROOT=$PWD
CACHE=${TRIMPROXY_TEST_CACHE:-$ROOT/.cache}/containers
IMAGE=trimproxy:$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml)
HOST_CA=
for arg in "$@"; do
  case $arg in
    --host-ca) HOST_CA=${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt} ;;
    *) echo "usage: $0 [--host-ca]" >&2; exit 2 ;;
  esac
done
mkdir -p "$CACHE"

step() { printf '== [%3ds] %s\n' "$SECONDS" "$*"; }
fail() { echo "container-test: $*" >&2; exit 1; }

apt_install() {
  step "installing $*"
  export DEBIAN_FRONTEND=noninteractive
  # Other jobs on the machine may hold apt's lock for a while.
  apt-get -o DPkg::Lock::Timeout=600 update -qq
  apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "$@" >/dev/null
}

pick_engine() {
  if [ -n "${CONTAINER_ENGINE:-}" ]; then
    ENGINE=$CONTAINER_ENGINE
  elif command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
    ENGINE=docker
  else
    ENGINE=podman
  fi
  case $ENGINE in docker | podman) ;; *) fail "CONTAINER_ENGINE=$ENGINE: docker or podman" ;; esac
}

# podman's settings that a sandboxed machine needs, in a drop-in file of its own, and
# only those the machine needs: runc where the cgroup hierarchy is not unified (crun
# refuses a hybrid one), and ulimits the sandbox lets a container have (podman asks
# for 1048576 files and processes; without CAP_SYS_RESOURCE no hard limit can be raised,
# and the sandbox caps what a container's init gets below the host shell's limits), and
# netavark where the CNI plugins are installed too (podman keeps to CNI once its store
# holds an image, and CNI without the dnsname plugin resolves no compose service name).
PODMAN_CONF=/etc/containers/containers.conf.d/60-trimproxy-ci.conf
RUNTIME_SETTINGS= NETWORK_SETTINGS= ULIMIT_SETTINGS=

# Whether a setting is made in podman's configuration other than our drop-in.
configured_elsewhere() {
  grep -rqs --exclude="$(basename "$PODMAN_CONF")" "^ *$1 *=" \
    /etc/containers/containers.conf /etc/containers/containers.conf.d
}

write_podman_conf() {
  local settings=$RUNTIME_SETTINGS$NETWORK_SETTINGS$ULIMIT_SETTINGS
  if [ -z "$settings" ]; then
    if [ -f "$PODMAN_CONF" ]; then step "removing $PODMAN_CONF (not needed)"; rm -f "$PODMAN_CONF"; fi
  elif [ "$(cat "$PODMAN_CONF" 2>/dev/null)" != "${settings%$'\n'}" ]; then
    step "writing $PODMAN_CONF"
    mkdir -p "$(dirname "$PODMAN_CONF")" && printf '%s' "$settings" >"$PODMAN_CONF"
  fi
}

configure_runtime() {
  if [ "$(stat -fc %T /sys/fs/cgroup)" != cgroup2fs ] && ! configured_elsewhere runtime; then
    RUNTIME_SETTINGS=$'[engine]\nruntime = "runc"\n'
  fi
  if [ -e /usr/lib/cni/bridge ] && ! configured_elsewhere network_backend; then
    NETWORK_SETTINGS=$'[network]\nnetwork_backend = "netavark"\n'
    # CNI's bridge, left by an earlier podman on CNI, holds the default network's subnet.
    if ip link show cni-podman0 >/dev/null 2>&1; then ip link delete cni-podman0; fi
  fi
  # Our old ulimits stay until the probe below has checked them.
  if grep -qs default_ulimits "$PODMAN_CONF"; then
    ULIMIT_SETTINGS=$(sed -n '/^\[containers\]/,$p' "$PODMAN_CONF")$'\n'
  fi
  write_podman_conf
}

# Whether a container starts from image $1 with the ulimits given after it.
starts() {
  local image=$1
  shift
  podman run --rm --network none "$@" "$image" true >/dev/null 2>&1
}

# The largest limit of kind $2 (nofile, nproc), from the host's hard limit $3 halving
# down, that a container of image $1 may have (the other kind held low meanwhile).
largest_limit() {
  local image=$1 kind=$2 n=$3 other=nproc
  if [ "$kind" = nproc ]; then other=nofile; fi
  if [ "$n" = unlimited ]; then n=1048576; fi
  while [ "$n" -ge 1024 ]; do
    starts "$image" --ulimit "$kind=$n:$n" --ulimit "$other=1024:1024" && { echo "$n"; return; }
    n=$((n / 2))
  done
  fail "podman cannot start a container with even $kind=1024: see \`podman run --rm $image true\`"
}

configure_ulimits() {
  local image=$1 nofile nproc
  if starts "$image"; then return; fi
  if configured_elsewhere default_ulimits; then
    fail "podman cannot start a container (\`podman run --rm $image true\`) with the default_ulimits set in /etc/containers"
  fi
  nofile=$(largest_limit "$image" nofile "$(ulimit -Hn)")
  nproc=$(largest_limit "$image" nproc "$(ulimit -Hu)")
  ULIMIT_SETTINGS=$'[containers]\n'"default_ulimits = [\"nofile=$nofile:$nofile\", \"nproc=$nproc:$nproc\"]"$'\n'
  write_podman_conf
  starts "$image" || fail "podman still cannot start a container with $PODMAN_CONF"
}

setup_engine() {
  local missing=()
  command -v mmdebstrap >/dev/null 2>&1 || missing+=(mmdebstrap)
  if [ "$ENGINE" = podman ]; then
    command -v podman >/dev/null 2>&1 || missing+=(podman)
    command -v runc >/dev/null 2>&1 || missing+=(runc)
    # Without recommends apt satisfies podman with the CNI plugins, not netavark.
    [ -x /usr/lib/podman/netavark ] || missing+=(netavark)
    [ -x /usr/lib/podman/aardvark-dns ] || missing+=(aardvark-dns)
    # netavark, podman's network backend, sets up NAT with iptables.
    command -v iptables >/dev/null 2>&1 || missing+=(iptables)
  elif ! docker info >/dev/null 2>&1; then
    # No daemon answers (CI has a client alone): Debian's, started below.
    command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
  fi
  if [ ${#missing[@]} -gt 0 ]; then apt_install "${missing[@]}"; fi
  if [ "$ENGINE" = podman ]; then
    configure_runtime
    # PyPI's podman-compose 1.x (Debian's 1.0.3 lacks `config`, stop_grace_period),
    # in a venv of its own: it is CI's tool, not a dependency of trimproxy.
    local venv=$CACHE/podman-compose
    if ! "$venv/bin/podman-compose" --version >/dev/null 2>&1; then
      step "installing podman-compose into $venv"
      python3 -m venv "$venv"
      "$venv/bin/pip" install -q 'podman-compose>=1.6,<2'
    fi
    COMPOSE="$venv/bin/podman-compose"
  else
    docker info >/dev/null 2>&1 || start_dockerd
    docker_plugins
    COMPOSE="docker compose"
  fi
}

# dockerd, when the machine has a docker client but no daemon (CI): started in the
# background with Docker's defaults, stopped again when the script exits. dockerd sets
# iptables' FORWARD policy to DROP and leaves it so: the machine's own is put back, for
# whatever else forwards here (podman's networks, test network namespaces).
DOCKERD_PID= FORWARD_POLICY=
start_dockerd() {
  step "starting dockerd (log: $CACHE/dockerd.log)"
  FORWARD_POLICY=$(iptables -S FORWARD 2>/dev/null | sed -n 's/^-P FORWARD //p')
  dockerd </dev/null >"$CACHE/dockerd.log" 2>&1 &
  DOCKERD_PID=$!
  trap stop_dockerd EXIT
  for _ in $(seq 60); do
    if docker info >/dev/null 2>&1; then return; fi
    kill -0 "$DOCKERD_PID" 2>/dev/null || fail "dockerd exited: see $CACHE/dockerd.log"
    sleep 1
  done
  fail "dockerd did not answer within 60 s: see $CACHE/dockerd.log"
}

stop_dockerd() {
  step "stopping dockerd"
  if kill -TERM "$DOCKERD_PID" 2>/dev/null; then wait "$DOCKERD_PID" || true; fi
  if [ -n "$FORWARD_POLICY" ]; then iptables -P FORWARD "$FORWARD_POLICY" || true; fi
}

# `docker compose` and `docker buildx` (BuildKit: `build --secret`), as a Docker user
# has them. Debian 12 has neither (its docker-compose is v1, which reads no `!override`
# nor `env_file: required`): Debian 13's packages, Go binaries that need only libc6,
# are fetched from the machine's own Debian mirror and installed.
docker_plugins() {
  local missing=()
  docker compose version >/dev/null 2>&1 || missing+=(docker-compose)
  docker buildx version >/dev/null 2>&1 || missing+=(docker-buildx)
  if [ ${#missing[@]} -eq 0 ]; then return; fi
  if [ "$(. /etc/os-release && echo "$VERSION_CODENAME")" != bookworm ]; then
    apt_install "${missing[@]}"
    return
  fi
  step "fetching ${missing[*]} from Debian 13"
  local apt=$CACHE/apt-trixie mirror opts
  mirror=$(apt-get indextargets --format '$(REPO_URI)' 'Identifier: Packages' \
    'Origin: Debian' 'Codename: bookworm' 'Component: main' | head -n1)
  [ -n "$mirror" ] || fail "no Debian bookworm source in apt's lists: run apt-get update"
  mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial" "$apt/debs"
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror trixie main" \
    >"$apt/sources.list"
  opts=(-o "Dir::Etc::SourceList=$apt/sources.list" -o Dir::Etc::SourceParts=/dev/null
    -o "Dir::State::Lists=$apt/lists" -o "Dir::Cache=$apt/cache" -o APT::Sandbox::User=root)
  apt-get "${opts[@]}" update -qq
  rm -f "$apt/debs"/*.deb
  (cd "$apt/debs" && apt-get "${opts[@]}" download -qq "${missing[@]}")
  apt_install "$apt/debs"/*.deb
  docker compose version >/dev/null && docker buildx version >/dev/null
}

# One base image from docker/ci/NAME.{packages,changes,hook}: the Debian packages, the
# image config (Dockerfile instructions that `import --change` takes), an optional
# customize hook. The tag is the hash of the three files, so a change rebuilds; the root
# file system is kept as a tar under .cache/containers to re-import on a fresh engine.
base_image() {
  local name=$1 dir=$ROOT/docker/ci hash tag tar recipe=()
  # The hook is optional (a missing file must not fail the pipe under pipefail).
  for f in "$dir/$name".{packages,changes,hook}; do if [ -f "$f" ]; then recipe+=("$f"); fi; done
  hash=$(cat "${recipe[@]}" | sha256sum | cut -c1-16)
  tag=localhost/trimproxy-ci/$name:$hash
  tar=$CACHE/$name-$hash.tar
  if $ENGINE image inspect "$tag" >/dev/null 2>&1; then echo "$tag"; return; fi
  if [ ! -s "$tar" ]; then
    step "mmdebstrap: bookworm with $(grep -v '^#' "$dir/$name.packages" | xargs)" >&2
    rm -f "$CACHE/$name"-*.tar
    local hook=() sources=()
    if [ -f "$dir/$name.hook" ]; then hook=(--customize-hook="sh $dir/$name.hook \"\$1\""); fi
    # The machine's own apt sources, as they are configured.
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
      if [ -s "$f" ]; then sources+=("$f"); fi
    done
    mmdebstrap --quiet --variant=essential \
      --include="$(grep -v '^#' "$dir/$name.packages" | paste -sd, -)" \
      --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
      --dpkgopt='path-exclude=/usr/share/locale/*' "${hook[@]}" \
      bookworm "$CACHE/$name-$hash.part.tar" "${sources[@]}" >&2
    mv "$CACHE/$name-$hash.part.tar" "$tar"
  fi
  local changes=()
  while IFS= read -r line; do changes+=(--change "$line"); done <"$dir/$name.changes"
  $ENGINE import "${changes[@]}" "$tar" "$tag" >/dev/null
  echo "$tag"
}

build_image() {
  local base=$1 flags=()
  # Without it podman writes OCI images, which have no HEALTHCHECK.
  if [ "$ENGINE" = podman ]; then flags+=(--format docker); fi
  if [ -n "$HOST_CA" ]; then flags+=(--secret "id=host-ca,src=$HOST_CA"); fi
  step "building $IMAGE on $base"
  # BuildKit: docker's legacy builder reads no RUN --mount.
  DOCKER_BUILDKIT=1 $ENGINE build "${flags[@]}" -f docker/Dockerfile -t "$IMAGE" \
    --build-arg PYTHON_IMAGE="$base" \
    --build-arg REVISION="$(git rev-parse HEAD 2>/dev/null || echo unknown)" .
}

pick_engine
step "engine: $ENGINE"
setup_engine
PYTHON_BASE=$(base_image python)
if [ "$ENGINE" = podman ]; then configure_ulimits "$PYTHON_BASE"; fi
REDIS_IMAGE=$(base_image redis)
PROMETHEUS_IMAGE=$(base_image prometheus)
build_image "$PYTHON_BASE"
[ -x .venv/bin/pytest ] || fail "no .venv: run scripts/test.sh first (it makes the project's venv)"
step "checks (pytest -m container tests/deploy/containers)"
export TRIMPROXY_CT_ENGINE=$ENGINE TRIMPROXY_CT_COMPOSE=$COMPOSE TRIMPROXY_CT_IMAGE=$IMAGE \
  TRIMPROXY_CT_PYTHON_IMAGE=$PYTHON_BASE TRIMPROXY_CT_REDIS_IMAGE=$REDIS_IMAGE \
  TRIMPROXY_CT_PROMETHEUS_IMAGE=$PROMETHEUS_IMAGE
PYTHONPATH=$ROOT .venv/bin/pytest -q -p no:cacheprovider -m container tests/deploy/containers
step "done"
