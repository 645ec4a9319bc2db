// streamclient drives a CRI streaming server the way crictl and kubectl do, with client-go's own
// executors and port forwarder, so the Python server is tested against the real protocol code.
//
//	streamclient exec URL spdy|websocket [-tty] [-stdin] [-resize 80x24,100x30] [-protocol v3.channel.k8s.io]
//	    stdio is the command's; exits with the remote exit code (prints "exit code N" on stderr),
//	    100 on any other error (printed on stderr).
//	streamclient portforward URL spdy|websocket LOCAL:REMOTE...
//	    prints "ready PORT..." (the local ports) once listening, forwards until stdin reaches EOF.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/tools/remotecommand"
	"k8s.io/client-go/transport/spdy"
	"k8s.io/client-go/util/exec"
	"k8s.io/streaming/pkg/httpstream"
)

type sizes struct{ queue []remotecommand.TerminalSize; done chan struct{} }

func (s *sizes) Next() *remotecommand.TerminalSize {
	if len(s.queue) == 0 {
		<-s.done
		return nil
	}
	size := s.queue[0]
	s.queue = s.queue[1:]
	return &size
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "error:", err)
	os.Exit(100)
}

func execCmd(u *url.URL, transport string, args []string) {
	fs := flag.NewFlagSet("exec", flag.ExitOnError)
	tty := fs.Bool("tty", false, "")
	stdin := fs.Bool("stdin", false, "")
	resize := fs.String("resize", "", "")
	protocol := fs.String("protocol", "", "offer only this SPDY protocol (default: client-go's list)")
	fs.Parse(args)
	config := &rest.Config{}
	var executor remotecommand.Executor
	var err error
	if transport == "spdy" && *protocol != "" {
		tr, upgrader, err := spdy.RoundTripperFor(config)
		if err != nil {
			fail(err)
		}
		executor, err = remotecommand.NewSPDYExecutorForProtocols(tr, upgrader, "POST", u, *protocol)
	} else if transport == "spdy" {
		executor, err = remotecommand.NewSPDYExecutor(config, "POST", u)
	} else {
		executor, err = remotecommand.NewWebSocketExecutor(config, "GET", u.String())
	}
	if err != nil {
		fail(err)
	}
	opts := remotecommand.StreamOptions{Stdout: os.Stdout, Tty: *tty}
	if !*tty {
		opts.Stderr = os.Stderr
	}
	if *stdin {
		opts.Stdin = os.Stdin
	}
	done := make(chan struct{})
	if *resize != "" {
		q := &sizes{done: done}
		for _, wh := range strings.Split(*resize, ",") {
			parts := strings.SplitN(wh, "x", 2)
			w, _ := strconv.Atoi(parts[0])
			h, _ := strconv.Atoi(parts[1])
			q.queue = append(q.queue, remotecommand.TerminalSize{Width: uint16(w), Height: uint16(h)})
		}
		opts.TerminalSizeQueue = q
	}
	err = executor.StreamWithContext(context.Background(), opts)
	close(done)
	var exitErr exec.CodeExitError
	if errors.As(err, &exitErr) {
		fmt.Fprintf(os.Stderr, "exit code %d: %s\n", exitErr.Code, exitErr.Error())
		os.Exit(exitErr.Code)
	}
	if err != nil {
		fail(err)
	}
}

func portForwardCmd(u *url.URL, transport string, ports []string) {
	var dialer httpstream.Dialer
	var err error
	if transport == "spdy" {
		tr, upgrader, err := spdy.RoundTripperFor(&rest.Config{})
		if err != nil {
			fail(err)
		}
		dialer = spdy.NewDialerForStreaming(upgrader, &http.Client{Transport: tr}, "POST", u)
	} else {
		dialer, err = portforward.NewSPDYOverWebsocketDialerForStreaming(u, &rest.Config{})
		if err != nil {
			fail(err)
		}
	}
	stop := make(chan struct{})
	ready := make(chan struct{})
	pf, err := portforward.NewOnAddressesForStreaming(dialer, []string{"127.0.0.1"}, ports, stop, ready, io.Discard, os.Stderr)
	if err != nil {
		fail(err)
	}
	go func() {
		<-ready
		forwarded, err := pf.GetPorts()
		if err != nil {
			fail(err)
		}
		line := "ready"
		for _, p := range forwarded {
			line += fmt.Sprintf(" %d", p.Local)
		}
		fmt.Println(line)
		io.Copy(io.Discard, bufio.NewReader(os.Stdin))
		close(stop)
	}()
	if err := pf.ForwardPorts(); err != nil {
		fail(err)
	}
}

func main() {
	if len(os.Args) < 4 {
		fmt.Fprintln(os.Stderr, "usage: streamclient exec|portforward URL spdy|websocket ...")
		os.Exit(2)
	}
	u, err := url.Parse(os.Args[2])
	if err != nil {
		fail(err)
	}
	switch os.Args[1] {
	case "exec":
		execCmd(u, os.Args[3], os.Args[4:])
	case "portforward":
		portForwardCmd(u, os.Args[3], os.Args[4:])
	default:
		fail(fmt.Errorf("unknown command %q", os.Args[1]))
	}
}
