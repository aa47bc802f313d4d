// Package agent is the workload of lab pods: small TCP and UDP servers that
// answer with their name and the client address they saw, matching clients
// (Dial, Ping) that run from inside a pod's network namespace, and a traffic
// generator that keeps a steady mix of allowed and denied flows going.
//
// Servers and clients take a network namespace path; they create their
// sockets inside it (see package nsrun) and can run in any process: inside
// the `dualflow lab agent` process started in a pod, or inside a test.
package agent

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"time"
)

// Protocols understood by the servers and clients.
const (
	TCP  = "tcp"
	UDP  = "udp"
	ICMP = "icmp" // ICMP or ICMPv6 echo, by the family of the address
)

// maxConns bounds concurrent TCP connections per server; beyond it new
// connections are closed at once (drop policy).
const maxConns = 256

// connTimeout bounds one TCP exchange on the server side.
const connTimeout = 5 * time.Second

// ServerConfig configures one pod's servers.
type ServerConfig struct {
	// Name is what the server answers, usually "namespace/pod".
	Name string
	// NetNS is the path of the namespace to listen in; empty means the
	// current one.
	NetNS string
	// TCP and UDP are the ports to serve, on every address of both families.
	TCP, UDP []uint16
	Logger   *slog.Logger
}

// Server serves the ports of one pod.
type Server struct {
	cfg ServerConfig
	tcp []net.Listener
	udp []net.PacketConn
}

// Listen opens every port of cfg, so that the pod answers as soon as it
// returns. Call Serve to answer, or Close.
func Listen(cfg ServerConfig) (*Server, error) {
	cfg.Logger = cmp.Or(cfg.Logger, slog.Default())
	s := &Server{cfg: cfg}
	open := func() error {
		for _, p := range cfg.TCP {
			l, err := net.Listen("tcp", ":"+strconv.Itoa(int(p)))
			if err != nil {
				return fmt.Errorf("listen tcp %d: %w", p, err)
			}
			s.tcp = append(s.tcp, l)
		}
		for _, p := range cfg.UDP {
			c, err := net.ListenPacket("udp", ":"+strconv.Itoa(int(p)))
			if err != nil {
				return fmt.Errorf("listen udp %d: %w", p, err)
			}
			s.udp = append(s.udp, c)
		}
		return nil
	}
	if err := inNetNS(cfg.NetNS, open); err != nil {
		s.Close()
		return nil, fmt.Errorf("server %s: %w", cfg.Name, err)
	}
	return s, nil
}

// Close closes every socket. Serve calls it when its context ends.
func (s *Server) Close() error {
	var errs []error
	for _, l := range s.tcp {
		errs = append(errs, l.Close())
	}
	for _, c := range s.udp {
		errs = append(errs, c.Close())
	}
	return errors.Join(errs...)
}

// Serve answers until ctx is cancelled, then closes the sockets and waits
// for every connection handler to finish.
func (s *Server) Serve(ctx context.Context) error {
	var wg sync.WaitGroup
	sem := make(chan struct{}, maxConns)
	for _, l := range s.tcp {
		wg.Go(func() { s.acceptLoop(l, sem, &wg) })
	}
	for _, c := range s.udp {
		wg.Go(func() { s.udpLoop(c) })
	}
	<-ctx.Done()
	s.Close()
	wg.Wait()
	return nil
}

// reply is the answer line: "<name> <client addr:port>\n".
func (s *Server) reply(peer net.Addr) []byte {
	return []byte(s.cfg.Name + " " + peer.String() + "\n")
}

func (s *Server) acceptLoop(l net.Listener, sem chan struct{}, wg *sync.WaitGroup) {
	for {
		c, err := l.Accept()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				s.cfg.Logger.Warn("accept failed", "server", s.cfg.Name, "err", err)
			}
			return
		}
		select {
		case sem <- struct{}{}:
		default:
			c.Close() // over maxConns: drop
			continue
		}
		wg.Go(func() {
			defer func() { <-sem }()
			defer c.Close()
			c.SetDeadline(time.Now().Add(connTimeout))
			if _, err := bufio.NewReader(c).ReadString('\n'); err != nil {
				return
			}
			c.Write(s.reply(c.RemoteAddr()))
		})
	}
}

func (s *Server) udpLoop(c net.PacketConn) {
	buf := make([]byte, 2048)
	for {
		_, peer, err := c.ReadFrom(buf)
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				s.cfg.Logger.Warn("udp read failed", "server", s.cfg.Name, "err", err)
			}
			return
		}
		c.WriteTo(s.reply(peer), peer)
	}
}
