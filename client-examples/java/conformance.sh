#!/usr/bin/env bash
# The conformance runner of the Java client (see ../conformance/README.md).
#
#   conformance.sh build            mvn -o install of the package (protoc, javac -Xlint:all
#                                   -Werror, JUnit) into <build dir>/conformance/m2, then the
#                                   runner (conformance/, a Maven project on the package's
#                                   coordinates) against it, and Netty's native libraries (epoll
#                                   from native-epoll.sh; Debian's netty-tcnative for TLS); the
#                                   build directory is outside the checkout (../build-dir.sh:
#                                   $WINDOW_BUILD_DIR/java, else one under ${TMPDIR:-/tmp}), which
#                                   is only read
#   conformance.sh run SCENARIO     execs the runner on that build (java, its classpath)
#
# Offline against Debian's Maven repository, like run-e2e.sh (maven-debian.sh); installs only
# the Debian packages that are missing.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../build-dir.sh
source "$here/../build-dir.sh"
out="$(build_dir java)/conformance"
case ${1:-} in
  build)
    # shellcheck source=../e2e-lib.sh
    source "$here/../e2e-lib.sh"
    # shellcheck source=maven-debian.sh
    source "$here/maven-debian.sh"
    need_java_toolchain
    need_java_tls
    install_missing
    rm -rf "$out"
    mkdir -p "$out"
    write_maven_settings "$out/settings.xml" "$out/m2"
    mvn_o=(mvn -o -B -Dstyle.color=never -s "$out/settings.xml" -Daether.offline.protocols=file)
    (cd "$here" && "${mvn_o[@]}" -Dwindow.build.directory="$out/target" install)
    (cd "$here/conformance" && "${mvn_o[@]}" -Dwindow.build.directory="$out/runner-target" package \
      org.apache.maven.plugins:maven-dependency-plugin:3.5.0:build-classpath \
      -Dmdep.outputFile="$out/classpath.txt")
    printf '%s:%s\n' "$out/runner-target/window-sidecar-conformance-0.1.0.jar" \
      "$(cat "$out/classpath.txt")" >"$out/runner-classpath.txt"
    # Netty's native libraries: epoll (the unix-socket scenario), built by native-epoll.sh, and
    # a copy of Debian's netty-tcnative JNI library (TLS) under the name Netty looks for (a
    # link would not do: the library takes its JNI package prefix from its own file name).
    mkdir -p "$out/native"
    cp "$maven_debian_tcnative_so" "$out/native/libnetty_tcnative_linux_$(uname -m | sed 's/^aarch64$/aarch_64/').so"
    printf '%s:%s\n' "$("$here/native-epoll.sh")" "$out/native" >"$out/library-path.txt"
    ;;
  run)
    [[ -f $out/runner-classpath.txt ]] || { echo "$0: run '$0 build' first" >&2; exit 1; }
    exec java "-Djava.library.path=$(cat "$out/library-path.txt")" \
      -cp "$(cat "$out/runner-classpath.txt")" dev.windowsidecar.conformance.Runner "$2"
    ;;
  *) echo "usage: $0 build | run SCENARIO.json" >&2; exit 2 ;;
esac
