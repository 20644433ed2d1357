package main

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/munchable/munchable-webhooks/internal/support"
)

// formatMessage is support show's page: the headers as a mail reader
// shows them, what the service knows beyond them (the sender's DMARC
// verdict, the thread, the forward), the attachments, then the text.
func formatMessage(m support.Shown) string {
	var b strings.Builder
	line := func(name, value string) {
		if value != "" {
			fmt.Fprintf(&b, "%-15s %s\n", name+":", value)
		}
	}
	fmt.Fprintf(&b, "Support message %d (%s, %s)\n", m.ID, m.Source, m.ExternalID)
	line("Received", m.Received.UTC().Format(time.RFC3339)+" (queued "+m.Queued.UTC().Format(time.RFC3339)+")")
	from := m.FromAddress
	if m.FromName != "" {
		from = m.FromName + " <" + m.FromAddress + ">"
	}
	line("From", from)
	line("Reply-To", m.ReplyTo)
	line("To", m.ToAddress)
	line("Subject", m.Subject)
	line("Message-ID", m.MessageID)
	line("In-Reply-To", m.InReplyTo)
	line("References", strings.Join(m.References, " "))
	line("Auto-Submitted", m.AutoSubmitted)
	line("Sender", senderVerdict(m))

	line("Thread", fmt.Sprintf("%d (%d messages)", m.ThreadID, len(m.Thread)))
	for _, t := range m.Thread {
		mark := ""
		if t.ID == m.ID {
			mark = "  <- this message"
		}
		fmt.Fprintf(&b, "  %d  %s  %s  %s%s\n", t.ID, t.Received.UTC().Format(time.RFC3339), t.From, t.Subject, mark)
	}
	line("Forward", forwardLine(m.Forward))

	line("Attachments", strconv.Itoa(len(m.Attachments)))
	for _, a := range m.Attachments {
		size := "size unknown"
		if a.Size >= 0 {
			size = strconv.FormatInt(a.Size, 10) + " bytes"
		}
		if a.NoContentReason != "" {
			size += ", not stored: " + a.NoContentReason
		}
		inline := ""
		if a.ContentID != "" {
			inline = ", inline (cid:" + a.ContentID + ")"
		}
		fmt.Fprintf(&b, "  %s  %s  %s%s\n", a.Filename, a.ContentType, size, inline)
	}
	if m.HTMLBytes > 0 {
		line("HTML body", fmt.Sprintf("%d bytes (support show %d --html)", m.HTMLBytes, m.ID))
	}
	b.WriteString("\n")
	b.WriteString(terminalText(m.Text))
	if !strings.HasSuffix(m.Text, "\n") {
		b.WriteString("\n")
	}
	return b.String()
}

// senderVerdict says how far the From address can be trusted.
func senderVerdict(m support.Shown) string {
	if m.Source == support.SourceWeb {
		return "the support form: the address is what the visitor typed, unverified"
	}
	checks := fmt.Sprintf("(SPF %s, DKIM %s)", orNone(m.AuthSPF), orNone(m.AuthDKIM))
	switch {
	case m.SenderAuthenticated == nil:
		return "DMARC " + orNone(m.AuthDMARC) + " " + checks + ": the From address is not authenticated"
	case *m.SenderAuthenticated:
		return "DMARC pass " + checks + ": the From address is authenticated"
	default:
		return "DMARC fail " + checks + ": the From address may be forged"
	}
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// forwardLine is the forward to the team, as the relay has it.
func forwardLine(f support.Forward) string {
	s := string(f.State)
	var details []string
	if f.ChangeID != nil {
		details = append(details, "change "+strconv.FormatInt(*f.ChangeID, 10))
	}
	if f.Attempts > 0 {
		details = append(details, fmt.Sprintf("%d attempts", f.Attempts))
	}
	if f.DeliveredAt != nil {
		details = append(details, "at "+f.DeliveredAt.UTC().Format(time.RFC3339))
	}
	if f.Result != nil {
		details = append(details, "Resend email "+*f.Result)
	}
	if f.NextAttemptAt != nil {
		details = append(details, "next attempt "+f.NextAttemptAt.UTC().Format(time.RFC3339))
	}
	if f.LastError != nil {
		details = append(details, "last error: "+support.OneLine(*f.LastError))
	}
	if len(details) > 0 {
		s += " (" + strings.Join(details, "; ") + ")"
	}
	return s
}

// terminalText is an untrusted body made safe to print to a terminal:
// each line cleaned as a one-line field is (an ESC would start an escape
// sequence in the operator's terminal), the line breaks kept.
func terminalText(text string) string {
	lines := strings.Split(text, "\n")
	for i, l := range lines {
		lines[i] = support.OneLine(strings.TrimSuffix(l, "\r"))
	}
	return strings.Join(lines, "\n")
}
