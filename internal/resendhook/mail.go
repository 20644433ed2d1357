package resendhook

import (
	"context"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/munchable/munchable-webhooks/internal/support"
)

// mailMetrics count what bounded reading did to inbound mail.
type mailMetrics struct {
	truncated *prometheus.CounterVec
}

func newMailMetrics() mailMetrics {
	m := mailMetrics{
		truncated: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "support_mail_truncated_total",
			Help: "Inbound mail bodies stored cut at 2 MiB, by part (text, html).",
		}, []string{"part"}),
	}
	// Both parts exported from 0: a series born at its first cut hides that
	// cut from rate() and increase().
	m.truncated.WithLabelValues("text")
	m.truncated.WithLabelValues("html")
	return m
}

// report logs and counts the cuts and skipped fields of an answer: a mail
// is queued whatever its size, and what it lost says so.
func (m mailMetrics) report(ctx context.Context, logger *slog.Logger, a answer) {
	if a.textCut() {
		m.truncated.WithLabelValues("text").Inc()
		logger.WarnContext(ctx, "text body cut", "text_bytes", a.textBytes, "kept_bytes", len(a.email.Text))
	}
	if a.htmlCut() {
		m.truncated.WithLabelValues("html").Inc()
		logger.WarnContext(ctx, "html body cut", "html_bytes", a.htmlBytes, "kept_bytes", len(a.email.HTML))
	}
	if len(a.skipped) > 0 {
		logger.WarnContext(ctx, "mail fields skipped", "fields", a.skipped, "cap_bytes", maxFieldsBytes, "decision_cap_bytes", maxDecisionBytes)
	}
}

// attachmentsOf lists and downloads the email's attachments, unless the
// email is queued already: a redelivery writes no attachments (Enqueue
// runs attach only for a new message), so its downloads would be wasted.
// The check is one indexed query; a delivery that races another past it
// downloads for nothing and writes nothing, which is rare and harmless.
func (h *handler) attachmentsOf(ctx context.Context, e *receivedEmail, held *hold) (downloads, error) {
	queued, err := h.queue.Queued(ctx, support.SourceEmail, e.ID)
	if err != nil || queued {
		return nil, err
	}
	return h.downloadAttachments(ctx, e, held)
}
