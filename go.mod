module github.com/kvcar/kvcar

go 1.26

require (
	github.com/klauspost/cpuid/v2 v2.2.10 // indirect
	github.com/pebbe/zmq4 v1.4.0 // indirect
	github.com/philhofer/fwd v1.2.0 // indirect
	github.com/tinylib/msgp v1.6.5 // indirect
	github.com/zeebo/xxh3 v1.1.0 // indirect
	golang.org/x/mod v0.18.0 // indirect
	golang.org/x/sys v0.30.0 // indirect
	golang.org/x/tools v0.22.0 // indirect
)
