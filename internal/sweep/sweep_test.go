package sweep

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestWindow(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	if got, want := Window(time.Time{}, now, 5*time.Minute, 10*time.Minute), now.Add(-15*time.Minute); !got.Equal(want) {
		t.Errorf("first pass from %v, want %v (one interval and the overlap back)", got, want)
	}
	last := now.Add(-6 * time.Minute)
	if got, want := Window(last, now, 5*time.Minute, 10*time.Minute), last.Add(-10*time.Minute); !got.Equal(want) {
		t.Errorf("next pass from %v, want %v (the last start less the overlap)", got, want)
	}
}

// A position near Stripe's 30 days is warned about and kept; one past it
// is logged at error and moved inside the horizon.
func TestCheckHorizon(t *testing.T) {
	t.Parallel()
	src := Source{Provider: "stripe", Horizon: 30 * 24 * time.Hour}
	for _, c := range []struct {
		age   time.Duration
		level string
		moved bool
	}{
		{24 * time.Hour, "", false},
		{26 * 24 * time.Hour, `"level":"WARN"`, false},
		{31 * 24 * time.Hour, `"level":"ERROR"`, true},
	} {
		var logs bytes.Buffer
		from := time.Now().Add(-c.age)
		got := checkHorizon(slog.New(slog.NewJSONHandler(&logs, nil)), src, from, 5*24*time.Hour)
		if moved := !got.Equal(from); moved != c.moved || (c.moved && time.Since(got) >= src.Horizon) {
			t.Errorf("age %s: from %v, want moved %t and inside the horizon", c.age, got, c.moved)
		}
		if (c.level == "") != (logs.Len() == 0) || !strings.Contains(logs.String(), c.level) {
			t.Errorf("age %s: logged %q, want %s", c.age, logs.String(), c.level)
		}
	}
}
