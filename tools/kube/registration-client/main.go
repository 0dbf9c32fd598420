// registration-client dials a kubelet plugin's registration socket exactly as kubelet 1.36.3's
// plugin watcher does (pkg/kubelet/pluginmanager/operationexecutor/operation_generator.go,
// dial: grpc.DialContext on the bare socket path with a unix context dialer, blocking, and no
// grpc.WithAuthority, so the HTTP/2 :authority sent is the socket's path) and calls GetInfo,
// so that the tests see what that kubelet sees. A package of the module tools/kube, whose
// go.mod pins the grpc-go and k8s.io/kubelet that kubelet 1.36.3 is built with. Built by
// scripts/fetch-registration-client.
//
// Usage: registration-client SOCKET
//
// `registration-client version` prints the sha256 of this file, go.mod and go.sum (set by
// scripts/fetch-registration-client's -ldflags), by which tests/support/registration_client.rs
// tells a binary built from other sources or other pins.
//
// stdout: the PluginInfo as JSON, exit status 0; or one line on stderr naming the error
// (gRPC code and message), exit status 1.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// Set with -ldflags -X by scripts/fetch-registration-client.
var sourceSHA256, goModSHA256, goSumSHA256 string

func main() {
	if len(os.Args) == 2 && os.Args[1] == "version" {
		fmt.Printf("source %s main.go\nsource %s go.mod\nsource %s go.sum\n", sourceSHA256, goModSHA256, goSumSHA256)
		return
	}
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: registration-client SOCKET")
		os.Exit(2)
	}
	path := os.Args[1]
	// kubelet's dial, as 1.36.3 has it, with its 10 s timeout (the watcher's dialTimeoutDuration).
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	//nolint:staticcheck // DialContext is what kubelet 1.36.3 calls.
	conn, err := grpc.DialContext(ctx, path,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithBlock(),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", addr)
		}),
	)
	if err != nil {
		fmt.Fprintf(os.Stderr, "dial %s: %v\n", path, err)
		os.Exit(1)
	}
	defer conn.Close()
	client := registerapi.NewRegistrationClient(conn)
	callCtx, callCancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer callCancel()
	info, err := client.GetInfo(callCtx, &registerapi.InfoRequest{})
	if err != nil {
		fmt.Fprintf(os.Stderr, "GetInfo: %v\n", err)
		os.Exit(1)
	}
	out, err := json.Marshal(info)
	if err != nil {
		fmt.Fprintf(os.Stderr, "encode: %v\n", err)
		os.Exit(1)
	}
	fmt.Println(string(out))
}
