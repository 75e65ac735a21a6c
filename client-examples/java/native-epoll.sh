#!/usr/bin/env bash
# Builds Netty's native epoll library (JNI), which grpc-java needs to reach a Unix socket, from
# Debian's own source of the installed libnetty-java: Debian ships netty-transport-native-epoll.jar
# without it. Prints the directory to pass as -Djava.library.path:
#
#   java -Djava.library.path="$(./native-epoll.sh)" -cp window-examples.jar ...
#
# The library is cached as <build dir>/native/libnetty_transport_native_epoll_<arch>.so (the
# name Netty's NativeLibraryLoader looks for), outside the checkout (../build-dir.sh:
# $WINDOW_BUILD_DIR/java, else one under ${TMPDIR:-/tmp}); a second run only prints the
# directory. Installs only
# what is missing (gcc, dpkg-dev, the JDK's JNI headers) and, when apt knows no source package,
# adds a deb-src twin of the system's Debian sources. Messages go to stderr.
set -euo pipefail
cd "$(dirname "$0")"
# shellcheck source=../build-dir.sh
source ../build-dir.sh
out="$(build_dir java)/native"

# Netty's PlatformDependent.normalizedArch() names.
case $(uname -m) in
  x86_64 | amd64) arch=x86_64 ;;
  aarch64 | arm64) arch=aarch_64 ;;
  *) echo "native-epoll.sh: no Netty name known for $(uname -m)" >&2; exit 1 ;;
esac
lib="$out/libnetty_transport_native_epoll_$arch.so"
if [[ -f $lib ]]; then
  echo "$out"
  exit 0
fi
log() { echo "native-epoll.sh: $*" >&2; }

sudo=""
[[ $(id -u) == 0 ]] || sudo=sudo
apt_install() {
  log "installing: $*"
  DEBIAN_FRONTEND=noninteractive $sudo apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
    --no-install-recommends "$@" >/dev/null
}

# The source must be that of the installed jar: the JNI functions are bound by name and
# signature to its Java classes.
version=$(dpkg-query -W -f='${Version}' libnetty-java 2>/dev/null || true)
[[ -n $version ]] || { log "libnetty-java is not installed"; exit 1; }
java_home=$(dirname "$(dirname "$(readlink -f "$(command -v javac)")")")
missing=()
command -v gcc >/dev/null || missing+=(gcc libc6-dev)
command -v dpkg-source >/dev/null || missing+=(dpkg-dev)
command -v xz >/dev/null || missing+=(xz-utils)
[[ -f $java_home/include/jni.h ]] || missing+=(default-jdk-headless)
updated=0
if ((${#missing[@]})); then
  $sudo apt-get update -qq
  updated=1
  apt_install "${missing[@]}"
  java_home=$(dirname "$(dirname "$(readlink -f "$(command -v javac)")")")
fi

# deb-src: the system's deb822 sources with Types: deb-src, in a file of their own.
has_source() { grep -qx "Version: $version" <<<"$(apt-cache showsrc netty 2>/dev/null)"; }
if ! has_source; then
  if ((updated == 0)); then
    $sudo apt-get update -qq
    updated=1
  fi
fi
if ! has_source; then
  lists=/etc/apt/sources.list.d
  if [[ -f $lists/debian.sources ]]; then
    twin=$lists/window-sidecar-src.sources
    log "adding $twin (deb-src of debian.sources)"
    sed 's/^Types:.*/Types: deb-src/' "$lists/debian.sources" | $sudo tee "$twin" >/dev/null
  elif [[ -f /etc/apt/sources.list ]]; then
    twin=$lists/window-sidecar-src.list
    log "adding $twin (deb-src of sources.list)"
    sed -n 's/^deb /deb-src /p' /etc/apt/sources.list | $sudo tee "$twin" >/dev/null
  else
    log "no Debian sources to derive a deb-src entry from"
    exit 1
  fi
  $sudo apt-get update -qq
  has_source || { log "apt knows no source package netty $version"; exit 1; }
fi

src="$out/src"
tree=""
[[ -d $src ]] && tree=$(find "$src" -mindepth 1 -maxdepth 1 -type d -name 'netty-*' | head -n1)
if [[ -z $tree || ! -f $src/.version || $(cat "$src/.version") != "$version" ]]; then
  rm -rf "$src"
  mkdir -p "$src"
  log "apt-get source netty=$version"
  # As root apt downloads unsandboxed (the _apt user cannot write here) and says so.
  quiet='^(dpkg-source: info|W: Download is performed unsandboxed)'
  (cd "$src" && apt-get source -qq "netty=$version" 2>&1 | grep -Ev "$quiet" >&2) || true
  tree=$(find "$src" -mindepth 1 -maxdepth 1 -type d -name 'netty-*' | head -n1)
  [[ -n $tree ]] || { log "apt-get source netty=$version unpacked nothing"; exit 1; }
  echo "$version" >"$src/.version"
fi

# The flags of transport-native-epoll's and transport-native-unix-common's pom.xml (-O3 there),
# linked into one shared library instead of through a static unix-common archive. Without
# NETTY_BUILD_STATIC it exports JNI_OnLoad and takes its package prefix (none here) from its
# own file name, which therefore stays libnetty_transport_native_epoll_<arch>.so.
log "compiling $lib"
mkdir -p "$out"
epoll_c=$tree/transport-native-epoll/src/main/c
unix_c=$tree/transport-native-unix-common/src/main/c
gcc -shared -fPIC -O2 -fno-omit-frame-pointer -fvisibility=hidden -Wno-attributes -Wunused-variable \
  -I"$java_home/include" -I"$java_home/include/linux" -I"$unix_c" "$epoll_c"/*.c "$unix_c"/*.c \
  -Wl,--no-as-needed -lrt -ldl -o "$lib.tmp"
mv "$lib.tmp" "$lib"
echo "$out"
