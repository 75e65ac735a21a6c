# shellcheck shell=bash
# The Debian packages the Go module builds against offline (see offline-modfile.sh): sourced
# after ../e2e-lib.sh by run-e2e.sh and conformance.sh, then `install_missing`.

# need_go_toolchain: adds to $missing the Go compiler and every Go source package the module
# requires that is not installed.
need_go_toolchain() {
  local gocode=/usr/share/gocode/src
  need_cmd go golang-go
  need_path $gocode/google.golang.org/grpc golang-google-grpc-dev
  need_path $gocode/google.golang.org/protobuf golang-google-protobuf-dev
  need_path $gocode/github.com/golang/protobuf golang-github-golang-protobuf-1-5-dev
  need_path $gocode/go.opentelemetry.io/otel golang-opentelemetry-otel-dev
}
