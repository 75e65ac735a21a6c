module example.invalid/example-app

go 1.19

require example.invalid/window-sidecar/client-examples/go v0.0.0-00010101000000-000000000000

require (
	github.com/golang/protobuf v1.5.2 // indirect
	golang.org/x/net v0.7.0 // indirect
	golang.org/x/sys v0.5.0 // indirect
	golang.org/x/text v0.7.0 // indirect
	google.golang.org/genproto v0.0.0-20200526211855-cb27e3aa2013 // indirect
	google.golang.org/grpc v1.33.3 // indirect
	google.golang.org/protobuf v1.28.1 // indirect
)

// Where the helper module is: here, the repository's copy. run-e2e.sh points it at the copy it
// installed outside the repository, as a team points it at theirs (or drops the replace once
// the module is served under its path).
replace example.invalid/window-sidecar/client-examples/go => ../
