package exporter

import (
	"flag"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/dualflow/dualflow/exporter/connstore"
	"github.com/dualflow/dualflow/test/support/ipfixtest"
)

func TestShardFlags(t *testing.T) {
	for _, tc := range []struct {
		name  string
		args  []string
		ok    bool
		check func(*testing.T, Config)
	}{
		{"one collector: no sharding", []string{"--exporter.ipfix.collector", "[fd00:10::1]:4739"}, true, func(t *testing.T, c Config) {
			if c.Shard.Enabled() {
				t.Errorf("sharding on: %+v", c.Shard)
			}
		}},
		{"static list", []string{"--exporter.collectors", "198.18.0.10:4739, [fd00:10::11]:4739", "--exporter.collector-failover-timeout", "3s",
			"--exporter.ipfix.buffer-bytes", "1048576"}, true, func(t *testing.T, c Config) {
			if !c.Shard.Enabled() || len(c.Shard.Collectors) != 2 || c.Shard.Collectors[1] != "[fd00:10::11]:4739" ||
				c.Shard.FailoverTimeout != 3*time.Second || c.Shard.IPFIX.BufferBytes != 1<<20 || c.Shard.IPFIX.ObservationDomainID == 0 {
				t.Errorf("%+v", c.Shard)
			}
		}},
		{"dns", []string{"--exporter.collectors-dns", "dualflow-collector.dualflow.svc:4739", "--exporter.collectors-dns-interval", "5s",
			"--exporter.collectors-dns-family", "ipv6"}, true, func(t *testing.T, c Config) {
			if c.Shard.DNS != "dualflow-collector.dualflow.svc:4739" || c.Shard.DNSInterval != 5*time.Second || c.Shard.DNSFamily != "ipv6" ||
				c.Shard.FailoverTimeout != 10*time.Second {
				t.Errorf("%+v", c.Shard)
			}
		}},
		{"list and dns", []string{"--exporter.collectors", "198.18.0.10:4739", "--exporter.collectors-dns", "c.svc:4739"}, false, nil},
		{"list and one collector", []string{"--exporter.collectors", "198.18.0.10:4739", "--exporter.ipfix.collector", "198.18.0.11:4739"}, false, nil},
		{"unbracketed ipv6", []string{"--exporter.collectors", "fd00:10::11:4739"}, false, nil},
		{"bad family", []string{"--exporter.collectors-dns", "c.svc:4739", "--exporter.collectors-dns-family", "ip5"}, false, nil},
		{"bad timeout", []string{"--exporter.collectors", "198.18.0.10:4739", "--exporter.collector-failover-timeout", "-1s"}, false, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := flag.NewFlagSet("test", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			c := NewConfig()
			c.BindFlags(fs)
			err := fs.Parse(tc.args)
			if err == nil {
				c.SetDefaults()
				err = c.Validate()
			}
			if (err == nil) != tc.ok {
				t.Fatalf("err %v", err)
			}
			if tc.check != nil {
				tc.check(t, c)
			}
		})
	}
}

// TestShardPipeline runs the exporter with two collectors (one on each
// loopback family): every record arrives at one of them, both get some,
// and the sharding metrics are served.
func TestShardPipeline(t *testing.T) {
	cols := []*ipfixtest.Collector{ipfixtest.Start(t, ipfixtest.Options{Address: "127.0.0.1:0"}), ipfixtest.Start(t, ipfixtest.Options{Address: "[::1]:0"})}
	cfg := testConfig("")
	cfg.IPFIX.Address = "127.0.0.1:4739" // the default: unused
	cfg.Shard.Collectors = []string{cols[0].Addr, cols[1].Addr}
	cfg.SetDefaults()
	var conns []connstore.Conn
	const n = 100
	for i := range n {
		conns = append(conns, conn(fmt.Sprintf("198.18.1.%d", i+1), "198.18.2.2", uint16(1000+i), 1),
			conn(fmt.Sprintf("fd00:10:1::%x", i+1), "fd00:10:2::2", uint16(1000+i), 1))
	}
	e, err := newExporter(cfg, newFake(conns...))
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, e)
	waitFor(t, 10*time.Second, "every record at a collector", func() bool { return cols[0].Len()+cols[1].Len() >= 2*n })
	m := scrape(t, e)
	for _, want := range []string{"dualflow_exporter_collectors 2", "dualflow_exporter_collectors_healthy 2",
		`dualflow_exporter_collector_records_routed_total{collector="` + cols[0].Addr + `"}`,
		`dualflow_exporter_collector_records_routed_total{collector="` + cols[1].Addr + `"}`,
		"dualflow_exporter_collector_failovers_total 0", "dualflow_exporter_ipfix_connected 1"} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if cols[0].Len() == 0 || cols[1].Len() == 0 {
		t.Fatalf("records per collector: %d, %d", cols[0].Len(), cols[1].Len())
	}
	if st := e.sender.Stats(); st.Records[0]+st.Records[1] != uint64(cols[0].Len()+cols[1].Len()) {
		t.Errorf("sent %v, received %d + %d", st.Records, cols[0].Len(), cols[1].Len())
	}
}
