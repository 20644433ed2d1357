// Where JavaScript runs, the form posts JSON with an Idempotency-Key, so a
// double-click or a retry after a lost answer makes one message. Without
// JavaScript the form posts as plain HTML and the server answers with pages.
(function () {
  "use strict";
  var form = document.getElementById("support-form");
  if (!form || !window.fetch || !window.crypto || !window.JSON) {
    return;
  }
  var fields = ["email", "name", "subject", "message"];
  var labels = { email: "Email", name: "Name", subject: "Subject", message: "Message" };
  var status = document.getElementById("support-status");

  function newKey() {
    var b = new Uint8Array(16);
    window.crypto.getRandomValues(b);
    return Array.prototype.map.call(b, function (x) { return ("0" + x.toString(16)).slice(-2); }).join("");
  }
  // One key per message: kept across repeated clicks, renewed once the text
  // changes or the message was received.
  var key = newKey();
  form.addEventListener("input", function () { key = newKey(); });

  function showErrors(errors) {
    fields.forEach(function (name) {
      var input = form.elements[name];
      var out = document.getElementById(name + "-error");
      var problem = errors[name];
      out.textContent = problem ? labels[name] + " " + problem : "";
      if (problem) {
        input.setAttribute("aria-invalid", "true");
        input.setAttribute("aria-describedby", name + "-error");
      } else {
        input.removeAttribute("aria-invalid");
        input.removeAttribute("aria-describedby");
      }
    });
  }

  form.addEventListener("submit", function (event) {
    event.preventDefault();
    var data = { website: form.elements.website.value };
    fields.forEach(function (name) { data[name] = form.elements[name].value; });
    status.textContent = "Sending your message...";
    fetch(form.action, {
      method: "POST",
      credentials: "omit",
      headers: { "Content-Type": "application/json", "Accept": "application/json", "Idempotency-Key": key },
      body: JSON.stringify(data)
    }).then(function (resp) {
      return resp.json().then(function (body) { return { status: resp.status, body: body }; });
    }).then(function (res) {
      if (res.status === 202) {
        showErrors({});
        form.reset();
        key = newKey();
        status.textContent = "Thank you: your message was received. We will reply by email.";
      } else if (res.status === 422 && res.body.errors) {
        showErrors(res.body.errors);
        status.textContent = "Your message was not sent: please check the fields marked above.";
      } else {
        status.textContent = "Your message was not sent: " + (res.body.error || "the server answered " + res.status) + ".";
      }
    }).catch(function () {
      status.textContent = "Your message could not be sent. Please check your connection and try again.";
    });
  });
}());
