# shellcheck shell=bash
# The Java client's offline Maven build on Debian, shared by run-e2e.sh and conformance.sh:
# sourced after ../e2e-lib.sh (need_cmd, need_path, install_missing).
#
#   need_java_toolchain           adds to $missing the Debian packages the build needs (Maven,
#                                 its plugins, protoc and the grpc-java plugin, the Java
#                                 libraries that put their artefacts in /usr/share/maven-repo)
#   need_java_tls                 … and what TLS needs with Debian's Netty (netty-tcnative)
#   write_maven_settings FILE M2  a settings file that makes Debian's repository the only one
#                                 ("central"; checksums ignored, Debian ships none), M2 the local
#                                 repository, and turns on the poms' profile "debian" (Debian's
#                                 Netty version, no epoll classifier)
#
# Then: mvn -o -s FILE -Daether.offline.protocols=file … (offline, a file: repository is the
# one kind Maven may still read).

maven_debian_repo=/usr/share/maven-repo

need_java_toolchain() {
  local repo=$maven_debian_repo
  need_cmd javac default-jdk-headless
  need_cmd mvn maven
  need_cmd unzip unzip
  need_cmd protoc protobuf-compiler
  command -v protoc-gen-grpc-java >/dev/null 2>&1 || need_cmd grpc_java_plugin protobuf-compiler-grpc-java-plugin
  # The proto imports google/protobuf/duration.proto, which protoc only recommends.
  need_path /usr/include/google/protobuf/duration.proto libprotobuf-dev
  # need_artifact PATH PACKAGE: PATH (group/artifact[/version]) of Debian's Maven repository.
  need_artifact() { need_path "$repo/$1" "$2"; }
  # The plugins the builds use, pinned in the poms to these Debian versions.
  need_artifact org/apache/maven/plugins/maven-compiler-plugin/3.10.1 libmaven-compiler-plugin-java
  need_artifact org/apache/maven/plugins/maven-resources-plugin/3.3.0 libmaven-resources-plugin-java
  need_artifact org/apache/maven/plugins/maven-jar-plugin/3.3.0 libmaven-jar-plugin-java
  need_artifact org/apache/maven/plugins/maven-surefire-plugin/2.22.3 libsurefire-java
  need_artifact org/apache/maven/plugins/maven-install-plugin/3.1.0 libmaven-install-plugin-java
  need_artifact org/apache/maven/plugins/maven-dependency-plugin/3.5.0 libmaven-dependency-plugin-java
  need_artifact org/codehaus/mojo/exec-maven-plugin/3.1.0 libexec-maven-plugin-java
  need_artifact org/codehaus/mojo/build-helper-maven-plugin/3.3.0 libbuild-helper-maven-plugin-java
  # The dependencies: the poms' own, and what Debian's grpc-java poms name but apt does not pull in.
  need_artifact io/grpc/grpc-netty/1.41.3 libgrpc-java
  need_artifact com/google/protobuf/protobuf-java/3.21.12 libprotobuf-java
  need_artifact io/netty/netty-transport-native-epoll/4.1.48.Final libnetty-java
  need_artifact org/apache/geronimo/specs/geronimo-annotation_1.3_spec/1.3 libgeronimo-annotation-1.3-spec-java
  need_artifact com/google/code/gson/gson/2.10 libgoogle-gson-java
  need_artifact junit/junit/4.13.2 junit4
  need_artifact org/hamcrest/hamcrest libhamcrest-java
  need_artifact com/google/guava/guava libguava-java
  need_artifact com/google/errorprone/error_prone_annotations liberror-prone-java
  need_artifact io/perfmark/perfmark-api libperfmark-java
  need_artifact org/codehaus/mojo/animal-sniffer-annotations libanimal-sniffer-java
  need_artifact com/google/api/grpc/proto-google-common-protos libgoogle-common-protos-java
  need_artifact com/google/code/findbugs/jsr305 libjsr305-java
  need_artifact org/jctools/jctools-core libjctools-java
}

# need_java_tls: adds Debian's netty-tcnative (OpenSSL for Netty) and its JNI library to
# $missing: Debian's Netty has no ALPN in its JDK provider, which TLS with grpc-java needs.
need_java_tls() {
  need_path "$maven_debian_repo/io/netty/netty-tcnative/2.0.28.Final" libnetty-tcnative-java
  need_path "$maven_debian_tcnative_so" libnetty-tcnative-jni
}
maven_debian_tcnative_so=/usr/lib/$(uname -m)-linux-gnu/jni/libnetty-tcnative.so

write_maven_settings() {
  local file=$1 m2=$2 repo=$maven_debian_repo
  cat >"$file" <<EOF
<settings>
  <localRepository>$m2</localRepository>
  <offline>true</offline>
  <profiles>
    <profile>
      <id>debian-repo</id>
      <repositories>
        <repository><id>central</id><url>file://$repo</url>
          <releases><checksumPolicy>ignore</checksumPolicy></releases>
          <snapshots><enabled>false</enabled></snapshots></repository>
      </repositories>
      <pluginRepositories>
        <pluginRepository><id>central</id><url>file://$repo</url>
          <releases><checksumPolicy>ignore</checksumPolicy></releases>
          <snapshots><enabled>false</enabled></snapshots></pluginRepository>
      </pluginRepositories>
    </profile>
  </profiles>
  <activeProfiles>
    <activeProfile>debian-repo</activeProfile>
    <activeProfile>debian</activeProfile>
  </activeProfiles>
</settings>
EOF
}
