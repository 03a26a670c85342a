//! The walk's steps over what a caller holds: backend state it remembered, its log lines,
//! tasks, its jira quota, and results kept for it.

use super::*;

impl Walk {
    pub(super) async fn remember(&mut self, who: Who) {
        let value = format!("{}-{}", PRINCIPALS[who.principal()], self.step);
        let c = self.client(who).await;
        let r = self.call(&c, "kit_remember", json!({"value": value})).await;
        if self.allowed[who.principal()].contains("kit") {
            assert_ne!(r.is_error, Some(true), "{}: {who:?} remember: {r:?}", self.at());
            self.remembered.insert((who, self.last_replica), value);
        } else {
            assert_eq!(r.is_error, Some(true), "{}: {who:?} used kit outside its scope", self.at());
        }
    }

    pub(super) async fn recall(&mut self, who: Who) {
        let c = self.client(who).await;
        let r = self.call(&c, "kit_recall", json!({})).await;
        if !self.allowed[who.principal()].contains("kit") {
            assert_eq!(r.is_error, Some(true), "{}: {who:?} used kit outside its scope", self.at());
            return;
        }
        let expected = self.remembered.get(&(who, self.last_replica)).cloned().unwrap_or_default();
        assert_eq!(text(&r), expected, "{}: {who:?} recalls another caller's state", self.at());
    }

    /// A call that asks the calling client's model (sampling) and one that logs: the question
    /// reaches the caller's own client only, and so does the log line, never another session's.
    pub(super) async fn ask_and_log(&mut self, who: Who) {
        let Who::Session(p, i) = who else { return self.recall(who).await };
        let c = self.client(who).await;
        let question = format!("q{}", self.step);
        let r = self.call(&c, "kit_ask", json!({"prompt": question})).await;
        if !self.allowed[p].contains("kit") {
            assert_eq!(r.is_error, Some(true), "{}: {who:?} used kit outside its scope", self.at());
            return;
        }
        let me = format!("{}#{i}", PRINCIPALS[p]);
        assert_eq!(text(&r), format!("{me} answers {question}"), "{}: {who:?}'s question", self.at());
        let line = format!("log {}", self.step);
        let r = self.call(&c, "kit_log", json!({"level": "info", "message": line})).await;
        assert_eq!(text(&r), "sent", "{}", self.at());
        // The client hands notifications to a task of their own: the line may trail the answer.
        let heard = || async { c.service().logs.lock().unwrap().contains(&line) };
        assert!(eventually(std::time::Duration::from_secs(10), heard).await, "{}: {who:?} got its log line", self.at());
        for ((q, j), other) in &self.sessions {
            let logs = other.service().logs.lock().unwrap().clone();
            let mine = (*q, *j) == (p, i);
            assert_eq!(logs.contains(&line), mine, "{}: {who:?}'s log line in session {q}.{j}: {logs:?}", self.at());
        }
    }

    pub(super) async fn make_task(&mut self, who: Who) {
        let c = self.client(who).await;
        let args = json!({"ms": 600_000, "label": "walk"});
        let request = match self.mode {
            "optimizer" => params("call_tool", json!({"tool_name": "kit_job", "parameters": args})),
            _ => params("kit_job", args),
        };
        let answer = c.peer().call_tool_once(request).await;
        match (self.allowed[who.principal()].contains("kit"), answer) {
            (true, Ok(CallToolResponse::Task(t))) => self.tasks.push((t.task.task_id, who, false)),
            (true, other) => panic!("{}: {who:?} expected a task, got {other:?}", self.at()),
            (false, Ok(CallToolResponse::Complete(r))) => {
                assert_eq!(r.is_error, Some(true), "{}: {who:?} ran kit_job outside its scope", self.at())
            }
            (false, Err(ServiceError::McpError(e))) => assert_eq!(e.code.0, -32602, "{}", self.at()),
            (false, other) => panic!("{}: {who:?} ran kit_job outside its scope: {other:?}", self.at()),
        }
    }

    pub(super) async fn follow_task(&mut self, who: Who) {
        if self.tasks.is_empty() && self.dead.is_empty() {
            return self.make_task(who).await;
        }
        let n = self.rng.random_range(0..self.tasks.len() + self.dead.len());
        let (id, owner, cancelled) = match self.tasks.get(n) {
            Some((id, owner, cancelled)) => (id.clone(), Some(*owner), *cancelled),
            None => (self.dead[n - self.tasks.len()].clone(), None, false),
        };
        let c = self.client(who).await;
        let got = c.peer().get_task(GetTaskParams::new(id.clone())).await;
        let owns = owner == Some(who);
        let may = self.allowed[who.principal()].contains("kit");
        match got {
            Ok(t) => {
                assert!(owns, "{}: {who:?} read task {id} of {owner:?}", self.at());
                assert!(may, "{}: {who:?} read a task whose tool it may no longer use", self.at());
                assert_eq!(t.task.task.task_id, id, "{}", self.at());
                let status = t.task.status();
                let expected =
                    if cancelled { [TaskStatus::Cancelled, TaskStatus::Working] } else { [TaskStatus::Working; 2] };
                assert!(expected.contains(&status), "{}: task {id} is {status:?}", self.at());
            }
            Err(ServiceError::McpError(e)) if e.code.0 == -32602 => {
                assert!(!(owns && may), "{}: {who:?} lost its own task {id}", self.at());
                if owns {
                    // Used while revoked: cancelled at the backend and forgotten for good.
                    self.kill(&id);
                }
            }
            Err(e) => panic!("{}: tasks/get: {e}", self.at()),
        }
        // Someone else's cancel is refused as for a task that does not exist; the task goes on.
        if let Some(owner) = owner.filter(|o| *o != who) {
            let refused = c.peer().cancel_task(CancelTaskParams::new(id.clone())).await;
            match refused {
                Err(ServiceError::McpError(e)) => assert_eq!(e.code.0, -32602, "{}: {e:?}", self.at()),
                other => panic!("{}: {who:?} cancelled {owner:?}'s task {id}: {other:?}", self.at()),
            }
        }
        if owns && may && !cancelled && self.rng.random_bool(0.2) {
            c.peer().cancel_task(CancelTaskParams::new(id.clone())).await.unwrap();
            // Still its owner's to read (cancelled), and nobody else's.
            if let Some(t) = self.tasks.iter_mut().find(|(t, _, _)| *t == id) {
                t.2 = true;
            }
        }
    }

    pub(super) fn kill(&mut self, id: &str) {
        self.tasks.retain(|(t, _, _)| t != id);
        self.dead.push(id.to_string());
    }

    /// One jira call against the caller's own quota: served while its principal has some left,
    /// refused by `walk` after, whatever the other principals spent.
    pub(super) async fn spend(&mut self, who: Who) {
        let p = who.principal();
        let c = self.client(who).await;
        let r = self.call(&c, "jira_get_ticket", json!({"key": "OPS-1"})).await;
        let said = text(&r);
        if !self.allowed[p].contains("jira") {
            assert!(
                r.is_error == Some(true) && !said.contains("`walk`"),
                "{}: out of scope, not limited: {said}",
                self.at()
            );
        } else if self.spent[p] < QUOTA {
            assert_ne!(
                r.is_error,
                Some(true),
                "{}: {} spent {} of {QUOTA}: {said}",
                self.at(),
                PRINCIPALS[p],
                self.spent[p]
            );
            self.spent[p] += 1;
        } else {
            assert!(r.is_error == Some(true) && said.contains("limit `walk`"), "{}: past the quota: {said}", self.at());
        }
    }

    /// A result over the walk's limit: cut, and kept for this principal.
    pub(super) async fn keep(&mut self, who: Who) {
        let p = who.principal();
        let c = self.client(who).await;
        let r = self.call(&c, "kit_big", json!({"kind": "text", "bytes": 4000})).await;
        if !self.allowed[p].contains("kit") {
            assert_eq!(r.is_error, Some(true), "{}: {who:?} used kit outside its scope", self.at());
            return;
        }
        let cut = r.meta.as_ref().map(|m| m.0["toolmux/cut"]["id"].clone());
        let id = cut.and_then(|v| v.as_str().map(str::to_owned));
        let id = id.unwrap_or_else(|| panic!("{}: {who:?}'s long result was not cut and kept: {r:?}", self.at()));
        self.kept.push((id, p));
    }

    /// A kept result read by `who`: whole for its principal, non-existent for anyone else.
    pub(super) async fn read_kept(&mut self, who: Who) {
        if self.kept.is_empty() {
            return self.keep(who).await;
        }
        let (id, owner) = self.kept[self.rng.random_range(0..self.kept.len())].clone();
        let c = self.client(who).await;
        let r = self.call(&c, "read_result", json!({"id": id, "length": 100_000})).await;
        let read =
            c.read_resource(rmcp::model::ReadResourceRequestParams::new(format!("toolmux://results/{id}/0"))).await;
        let said = text(&r);
        if who.principal() == owner {
            assert!(
                r.is_error != Some(true) && said.starts_with("line 0: "),
                "{}: {who:?} reads its own: {said}",
                self.at()
            );
            assert!(said.len() >= 4000, "{}: the whole: {} bytes", self.at(), said.len());
            assert!(read.is_ok(), "{}: {who:?} reads its own as a resource: {read:?}", self.at());
        } else {
            assert!(
                r.is_error == Some(true) && said.contains("no kept result") && !said.contains("line 0"),
                "{}: {who:?} read {}'s kept result: {said}",
                self.at(),
                PRINCIPALS[owner]
            );
            let refused = read.expect_err("another principal's kept result is not read").to_string();
            assert!(refused.contains("no kept result") && !refused.contains("line 0"), "{}: {refused}", self.at());
        }
    }
}
