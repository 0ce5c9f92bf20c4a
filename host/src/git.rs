//! Git: one cached clone per repository, one worktree per attempt, commits and pushes.
//!
//! The cache is a bare clone under `<work-dir>/repos/<owner>/<name>.git` whose fetch maps the
//! remote's branches to `refs/remotes/origin/*`. An attempt's worktree is a repository of its
//! own that borrows the cache's objects (`git clone --shared`): what the agent commits is
//! written to the worktree's own objects, never to the cache that other attempts read, and
//! inside the step's walls the cache's objects are all it sees of the cache, read-only. It is
//! detached at the tip of its branch on the remote (`shopfloor/<issue>-<slug>`, so a later run
//! on the same issue goes on from the earlier run's commits) or, when the branch does not exist
//! yet, at the remote's default branch. The work reaches the branch by `git push origin
//! HEAD:refs/heads/<branch>` (the worktree's `origin` is the remote), which never forces: a
//! push that would drop a commit on the remote fails.
//!
//! Every call has a time limit and `GIT_TERMINAL_PROMPT=0` (git never waits for a password);
//! past its limit its process group is killed (`process::call`). The installation token, when
//! the assignment carries one, reaches git through `GIT_CONFIG_*` variables of the fetch and
//! push calls only: it is never written to disk or put on a command line.

use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine as _;
use protocol::Secret;
use tokio::process::Command;

use crate::process::{self, CallError};

#[derive(Debug, thiserror::Error)]
pub enum GitError {
    #[error(transparent)]
    Call(#[from] CallError),
    #[error("git {what} failed: {stderr}")]
    Failed { what: String, stderr: String },
    /// The remote's rules refused a push ([`refused_by_rules`]): a protected branch, a hook,
    /// a repository rule, or GitHub refusing an App's change under `.github/workflows/`. The
    /// same work is refused again, unlike a cut connection, a remote's own failure or a branch
    /// that moved meanwhile (`! [rejected]`), which a later attempt gets past.
    #[error("the remote refused the push: {0}")]
    Refused(String),
    #[error("{0}")]
    Other(String),
}

/// How git is called for one repository.
#[derive(Debug, Clone)]
pub struct Git {
    pub timeout: Duration,
    /// The installation token for fetch and push, if any.
    pub token: Option<Secret>,
    pub author_name: String,
    pub author_email: String,
}

impl Git {
    /// Runs `git <args>` in `dir`; `auth` adds the token (fetch, push, clone).
    async fn run(&self, dir: &Path, args: &[&str], auth: bool) -> Result<String, GitError> {
        let mut cmd = Command::new("git");
        cmd.args(args).current_dir(dir).env("GIT_ASKPASS", "true").env("GCM_INTERACTIVE", "never").env("LC_ALL", "C");
        if let (true, Some(token)) = (auth, &self.token) {
            let basic = base64::engine::general_purpose::STANDARD.encode(format!("x-access-token:{}", token.expose()));
            cmd.env("GIT_CONFIG_COUNT", "1").env("GIT_CONFIG_KEY_0", "http.extraHeader").env("GIT_CONFIG_VALUE_0", format!("AUTHORIZATION: basic {basic}"));
        }
        let what = args.first().copied().unwrap_or("git").to_owned();
        let out = process::call(cmd, &format!("git {what}"), self.timeout).await?;
        let stderr = out.stderr.trim();
        if out.status == Some(0) {
            Ok(out.stdout)
        } else if refused_by_rules(stderr) {
            // The refused ref and the remote's own words say why; GitHub's can run long, so the
            // refusal comes first.
            let refused = stderr.lines().filter(|l| l.contains("[remote rejected]"));
            let remote = stderr.lines().filter(|l| l.starts_with("remote:"));
            Err(GitError::Refused(refused.chain(remote).collect::<Vec<_>>().join("\n").chars().take(500).collect()))
        } else {
            Err(GitError::Failed { what: args.join(" ").chars().take(120).collect(), stderr: stderr.chars().take(500).collect() })
        }
    }

    /// Clones `url` into the cache at `cache` the first time, then fetches.
    pub async fn ensure_cache(&self, cache: &Path, url: &str) -> Result<(), GitError> {
        if !cache.join("HEAD").exists() {
            let parent = cache.parent().ok_or_else(|| GitError::Other("cache path has no parent".into()))?;
            std::fs::create_dir_all(parent).map_err(|e| GitError::Other(format!("cannot create {}: {e}", parent.display())))?;
            // Cloned aside and renamed, so a clone cut short never looks like a cache.
            let partial = cache.with_extension("partial");
            let _ = std::fs::remove_dir_all(&partial);
            let target = partial.to_string_lossy().into_owned();
            self.run(parent, &["clone", "--bare", "--quiet", url, &target], true).await?;
            self.run(&partial, &["config", "remote.origin.fetch", "+refs/heads/*:refs/remotes/origin/*"], false).await?;
            std::fs::rename(&partial, cache).map_err(|e| GitError::Other(format!("cannot move the clone into place: {e}")))?;
        }
        self.run(cache, &["fetch", "--prune", "--quiet", "origin"], true).await?;
        Ok(())
    }

    /// The commit a ref names, if it exists.
    async fn resolve(&self, dir: &Path, rev: &str) -> Result<Option<String>, GitError> {
        match self.run(dir, &["rev-parse", "--verify", "--quiet", &format!("{rev}^{{commit}}")], false).await {
            Ok(sha) => Ok(Some(sha.trim().to_owned())),
            Err(GitError::Failed { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Makes the worktree at `path`, a clone of the cache that borrows its objects, with the
    /// remote at `url` as its `origin`, detached at the branch's tip on the remote when it
    /// exists, else at the default branch's. Returns the commit it starts from.
    pub async fn add_worktree(&self, cache: &Path, path: &Path, url: &str, branch: &str, base: &str) -> Result<String, GitError> {
        let start = match self.resolve(cache, &format!("refs/remotes/origin/{branch}")).await? {
            Some(sha) => sha,
            None => self
                .resolve(cache, &format!("refs/remotes/origin/{base}"))
                .await?
                .ok_or_else(|| GitError::Other(format!("the remote has neither `{branch}` nor `{base}`")))?,
        };
        // A worktree left by an attempt that died goes first.
        let _ = std::fs::remove_dir_all(path);
        let (source, target) = (cache.to_string_lossy().into_owned(), path.to_string_lossy().into_owned());
        self.run(cache, &["clone", "--shared", "--no-checkout", "--quiet", &source, &target], false).await?;
        self.run(path, &["remote", "set-url", "origin", url], false).await?;
        self.run(path, &["checkout", "--detach", "--quiet", &start], false).await?;
        Ok(start)
    }

    /// Removes a worktree (and what the attempt left in it).
    pub fn remove_worktree(path: &Path) {
        let _ = std::fs::remove_dir_all(path);
    }

    /// Commits whatever the harness left uncommitted in the worktree; returns the work done
    /// since `start`.
    pub async fn commit_all(&self, wt: &Path, message: &str, start: &str) -> Result<Work, GitError> {
        self.run(wt, &["add", "--all"], false).await?;
        let dirty = !self.run(wt, &["status", "--porcelain"], false).await?.trim().is_empty();
        if dirty {
            let (name, email) = (format!("user.name={}", self.author_name), format!("user.email={}", self.author_email));
            // No hooks: a repository's hook could wait for input or run for long.
            self.run(wt, &["-c", &name, "-c", &email, "commit", "--quiet", "--no-verify", "-m", message], false).await?;
        }
        let head = self.run(wt, &["rev-parse", "HEAD"], false).await?.trim().to_owned();
        let range = format!("{start}..{head}");
        let log = self.run(wt, &["log", "--reverse", "--format=%H%x09%s", &range], false).await?;
        let commits = log
            .lines()
            .filter_map(|l| l.split_once('\t'))
            .map(|(sha, subject)| Commit { sha: sha.to_owned(), subject: subject.chars().take(200).collect() })
            .collect();
        let files = self.run(wt, &["diff", "--name-only", start, &head], false).await?.lines().map(str::to_owned).collect();
        Ok(Work { head, commits, files })
    }

    /// Pushes the worktree's HEAD to `branch` on the remote, never forced.
    pub async fn push(&self, wt: &Path, branch: &str) -> Result<(), GitError> {
        self.run(wt, &["push", "--quiet", "origin", &format!("HEAD:refs/heads/{branch}")], true).await.map(|_| ())
    }
}

/// Whether a push's `stderr` says the remote's rules refused it: a `! [remote rejected]` ref
/// whose reason is a refusal (`pre-receive hook declined`, `protected branch hook declined`,
/// `push declined due to repository rule violations`, `refusing to allow a GitHub App to
/// create or update workflow … without workflows permission`), not the remote failing
/// (`Internal Server Error`, `failed to update ref`, `cannot lock ref …`), which may pass later.
fn refused_by_rules(stderr: &str) -> bool {
    stderr.lines().filter_map(|l| l.split_once("[remote rejected]")).any(|(_, rest)| {
        let reason = rest.rsplit_once('(').map_or("", |(_, r)| r).to_ascii_lowercase();
        ["declined", "refusing", "permission", "protected"].iter().any(|word| reason.contains(word))
    })
}

/// A commit the step made.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Commit {
    pub sha: String,
    pub subject: String,
}

/// What a step did in its worktree.
#[derive(Debug, Clone, PartialEq)]
pub struct Work {
    pub head: String,
    pub commits: Vec<Commit>,
    pub files: Vec<String>,
}

/// Where the cache of `owner/name` lives.
pub fn cache_path(work_dir: &Path, full_name: &str) -> PathBuf {
    let safe: String = full_name.chars().map(|c| if c.is_ascii_alphanumeric() || "._-/".contains(c) { c } else { '_' }).collect();
    let safe = safe.replace("..", "_");
    work_dir.join("repos").join(format!("{safe}.git"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(dir: &Path, script: &str) {
        let ok = std::process::Command::new("sh").arg("-c").arg(script).current_dir(dir).status().unwrap().success();
        assert!(ok, "{script}");
    }

    fn git() -> Git {
        Git { timeout: Duration::from_secs(30), token: None, author_name: "t".into(), author_email: "t@example.com".into() }
    }

    /// A directory with `remote.git`, a bare repository whose `main` has one empty commit.
    fn remote() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        sh(
            dir.path(),
            "git init -q --bare -b main remote.git && git clone -q remote.git seed 2>/dev/null && cd seed && git -c user.name=a -c user.email=a@b commit -q --allow-empty -m init && git push -q origin HEAD:main",
        );
        dir
    }

    #[tokio::test]
    async fn a_worktree_starts_from_the_branch_when_it_exists_and_pushes_without_force() {
        let dir = remote();
        let d = dir.path();
        let g = git();
        let cache = cache_path(d, "acme/widgets");
        let url = d.join("remote.git").to_string_lossy().into_owned();
        g.ensure_cache(&cache, &url).await.unwrap();

        let wt = d.join("wt1");
        let start = g.add_worktree(&cache, &wt, &url, "shopfloor/1-x", "main").await.unwrap();
        std::fs::write(wt.join("a.txt"), "a").unwrap();
        let work = g.commit_all(&wt, "first", &start).await.unwrap();
        assert_eq!((work.commits.len(), work.files.clone()), (1, vec!["a.txt".to_owned()]));
        g.push(&wt, "shopfloor/1-x").await.unwrap();
        Git::remove_worktree(&wt);
        assert!(!wt.exists());

        // A later attempt goes on from the branch.
        g.ensure_cache(&cache, &url).await.unwrap();
        let wt2 = d.join("wt2");
        let start2 = g.add_worktree(&cache, &wt2, &url, "shopfloor/1-x", "main").await.unwrap();
        assert_eq!(start2, work.head);
        assert!(wt2.join("a.txt").exists());
        // What an attempt commits is its own: the cache, which every attempt borrows from,
        // never holds it before it is pushed and fetched.
        std::fs::write(wt2.join("secret.txt"), "mine").unwrap();
        let mine = g.commit_all(&wt2, "mine", &start2).await.unwrap();
        assert!(g.resolve(&wt2, &mine.head).await.unwrap().is_some());
        assert_eq!(g.resolve(&cache, &mine.head).await.unwrap(), None, "an attempt's commit reached the shared cache");

        // A push that would drop a commit on the remote is refused, not by the remote's rules:
        // a later attempt starting from the remote's branch gets past it.
        let wt3 = d.join("wt3");
        let start3 = g.add_worktree(&cache, &wt3, &url, "other", "main").await.unwrap();
        std::fs::write(wt3.join("b.txt"), "b").unwrap();
        g.commit_all(&wt3, "elsewhere", &start3).await.unwrap();
        let moved = g.push(&wt3, "shopfloor/1-x").await.unwrap_err();
        assert!(matches!(moved, GitError::Failed { .. }), "{moved}");
    }

    #[test]
    fn a_refusal_by_the_remotes_rules_is_told_from_the_remote_failing() {
        let refused = [
            " ! [remote rejected] main -> main (protected branch hook declined)",
            " ! [remote rejected] HEAD -> shopfloor/1-x (refusing to allow a GitHub App to create or update workflow `.github/workflows/ci.yml` without `workflows` permission)",
            " ! [remote rejected] main -> main (push declined due to repository rule violations)",
            " ! [remote rejected] HEAD -> x (pre-receive hook declined)",
        ];
        for line in refused {
            assert!(
                refused_by_rules(&format!("remote: error: GH006\nTo https://github.com/acme/widgets.git\n{line}\nerror: failed to push some refs")),
                "{line}"
            );
        }
        let passing = [
            " ! [remote rejected] main -> main (Internal Server Error)",
            " ! [remote rejected] x -> x (failed to update ref)",
            " ! [remote rejected] x -> x (cannot lock ref 'refs/heads/x': is at 1 but expected 2)",
            " ! [rejected]        x -> x (fetch first)",
            "fatal: unable to access 'https://github.com/acme/widgets.git/': Could not resolve host: github.com",
        ];
        for line in passing {
            assert!(!refused_by_rules(line), "{line}");
        }
    }

    #[tokio::test]
    async fn a_push_the_remote_refuses_says_so_in_the_remotes_words() {
        let dir = remote();
        let d = dir.path();
        // What GitHub says to an App's token without the `workflows` permission, from a hook.
        let hook = d.join("remote.git/hooks/pre-receive");
        let noise: String = (0..40).map(|i| format!("echo 'padding line {i} of a long explanation' >&2\n")).collect();
        std::fs::write(
            &hook,
            format!("#!/bin/sh\n{noise}echo 'refusing to allow a GitHub App to create or update workflow `.github/workflows/ci.yml` without `workflows` permission' >&2\nexit 1\n"),
        )
        .unwrap();
        std::fs::set_permissions(&hook, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let g = git();
        let cache = cache_path(d, "acme/widgets");
        let url = d.join("remote.git").to_string_lossy().into_owned();
        g.ensure_cache(&cache, &url).await.unwrap();
        let wt = d.join("wt");
        let start = g.add_worktree(&cache, &wt, &url, "shopfloor/2-ci", "main").await.unwrap();
        std::fs::create_dir_all(wt.join(".github/workflows")).unwrap();
        std::fs::write(wt.join(".github/workflows/ci.yml"), "on: push").unwrap();
        g.commit_all(&wt, "ci", &start).await.unwrap();
        let refused = g.push(&wt, "shopfloor/2-ci").await.unwrap_err();
        let GitError::Refused(why) = &refused else { panic!("not a refusal: {refused}") };
        // The refused ref first, then the remote's words, within the 500 characters kept.
        assert!(why.starts_with(" ! [remote rejected] HEAD -> shopfloor/2-ci (pre-receive hook declined)"), "{why}");
        assert!(why.contains("remote: padding line 0"), "{why}");
        assert!(why.chars().count() <= 500);
    }
}
