package api

import (
	"bufio"
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// seqStore answers follow polls: the first poll one flow, then nothing.
type seqStore struct {
	mu    sync.Mutex
	polls int
	sqls  []string
	recv  int64 // time_received of the flow
}

func (s *seqStore) Query(_ context.Context, q, _ string) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.polls++
	s.sqls = append(s.sqls, q)
	if s.polls <= 2 { // the second poll sees the same row again (overlap)
		return []byte(`{"flow_end_ms":1000,"ip_version":6,"src_ip":"fd00:10::1","dst_ip":"fd00:10::2","protocol_name":"TCP","key":"7","time_received_ms":` + strconv.FormatInt(s.recv, 10) + `}` + "\n"), nil
	}
	return nil, nil
}

func TestFollowStreamsNewFlows(t *testing.T) {
	st := &seqStore{recv: time.Now().UnixMilli() + 60_000}
	a, err := New(Config{Store: st, FollowInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(a.Handler())
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+"/api/v1/flows?follow=true&ip_version=6&dst_ip=fd00:10::/32", nil)
	r, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		t.Errorf("content type %q", ct)
	}
	sc := bufio.NewScanner(r.Body)
	var events []string
	for sc.Scan() && len(events) < 5 {
		if ev, ok := strings.CutPrefix(sc.Text(), "event:"); ok {
			events = append(events, ev)
		}
		if strings.HasPrefix(sc.Text(), "data:") && strings.Contains(sc.Text(), "fd00:10::2") {
			events = append(events, "data")
		}
	}
	if len(events) < 3 || events[0] != "flow" || events[1] != "data" || events[2] != "heartbeat" || events[3] != "heartbeat" || events[4] != "heartbeat" {
		t.Errorf("events %v", events)
	}
	cancel()
	st.mu.Lock()
	defer st.mu.Unlock()
	// The second poll starts after the newest time_received seen, keeps
	// the filters, and never pages by flow_end.
	if len(st.sqls) < 2 || !strings.Contains(st.sqls[1], "time_received > fromUnixTimestamp64Milli("+strconv.FormatInt(st.recv-followOverlap.Milliseconds(), 10)+", 'UTC')") ||
		!strings.Contains(st.sqls[1], "ip_version = 6") || !strings.Contains(st.sqls[1], "dst_ip_bin BETWEEN") {
		t.Errorf("follow SQL %q", st.sqls)
	}
}
