package cluster

import (
	"context"
	"io"
	"net"
	"path/filepath"
	"sync"

	"k8s.io/client-go/tools/clientcmd"
)

// ServeAPI makes the API server reachable from this machine's loopback, as
// an operator's kubectl reaches a cluster: a TCP relay on addr (e.g.
// 127.0.0.1:0) into the control plane's namespace, and a kubeconfig for it
// (the API server's certificate is checked against its own address). It
// returns the kubeconfig's path; the relay stops with ctx.
func (c *Cluster) ServeAPI(ctx context.Context, addr string) (string, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", err
	}
	target := net.JoinHostPort(c.plan.apiAddr().String(), "6443")
	go func() {
		<-ctx.Done()
		ln.Close()
	}()
	go func() {
		var wg sync.WaitGroup
		defer wg.Wait()
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() { c.relay(ctx, conn, target) })
		}
	}()
	cfg, err := clientcmd.LoadFromFile(c.Kubeconfig)
	if err != nil {
		ln.Close()
		return "", err
	}
	for _, cl := range cfg.Clusters {
		cl.Server = "https://" + ln.Addr().String()
		cl.TLSServerName = c.plan.apiAddr().String()
	}
	path := filepath.Join(c.cfg.Dir, "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		ln.Close()
		return "", err
	}
	return path, nil
}

// relay copies between conn and target, dialled from the control plane's
// namespace, until either side closes.
func (c *Cluster) relay(ctx context.Context, conn net.Conn, target string) {
	defer conn.Close()
	up, err := c.API.Dial(ctx, "tcp", target) // from the control plane's namespace
	if err != nil {
		return
	}
	defer up.Close()
	done := make(chan struct{}, 2)
	cp := func(dst, src net.Conn) {
		io.Copy(dst, src) // ends when either side closes or resets
		if tc, ok := dst.(*net.TCPConn); ok {
			tc.CloseWrite()
		}
		done <- struct{}{}
	}
	go cp(up, conn)
	go cp(conn, up)
	select {
	case <-done:
		<-done
	case <-ctx.Done():
	}
}
