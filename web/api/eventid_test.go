package api

import (
	"strconv"
	"testing"
	"time"
)

func TestParseEventIDRefusesTheFuture(t *testing.T) {
	now := time.Now().UnixMilli()
	if _, err := parseEventID(strconv.FormatInt(now-1000, 10) + "-7"); err != nil {
		t.Errorf("a past id: %v", err)
	}
	for _, id := range []string{strconv.FormatInt(now+int64(time.Hour/time.Millisecond), 10) + "-7", "9223372036854775807-1", "-1-2", "x-1", "12"} {
		if _, err := parseEventID(id); err == nil {
			t.Errorf("id %q accepted", id)
		}
	}
}
