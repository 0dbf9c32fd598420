//! The view thread both plugins run: it opens what the view is computed from, computes the
//! first view, starts the [`watchdog`], and then computes a view again after each change of
//! the ledger or the config file ([`FileWatch`]) and at least every poll interval, handing
//! each to the plugin's readers through a `watch` channel.

use std::io;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::file_watch::FileWatch;
use super::watchdog::{self, FirstViewError, StaleView};

/// What a new view changes for the plugin's readers.
pub enum Change {
    /// Nothing a reader acts on: the view is replaced without waking anyone.
    Silent,
    /// Something only the plugin's own tasks act on: they are woken, nothing is logged.
    Quiet,
    /// What kubelet or the scheduler sees: readers are woken and the view is logged.
    Shown,
}

/// Computes a plugin's views. Opened on the view thread and never leaves it, so it need not
/// be `Send` (an NVML inventory is not).
pub trait Refresh: 'static {
    type View: StaleView;
    /// The view now; what cannot be read gives a view that offers nothing, with the reason.
    fn view(&mut self) -> Self::View;
    /// What `next` changes against `current`.
    fn change(current: &Self::View, next: &Self::View) -> Change;
}

/// Why the view thread did not give a first view.
#[derive(Debug)]
pub enum StartError<E> {
    /// Opening what the view is computed from failed (the plugin's own error).
    Open(E),
    /// The view thread or the watchdog's could not be started.
    Thread(io::Error),
    FirstView(FirstViewError),
}

impl<E> From<FirstViewError> for StartError<E> {
    fn from(e: FirstViewError) -> Self {
        StartError::FirstView(e)
    }
}

/// Ends the view thread when dropped, at its next wake; it also ends when every reader of the
/// views is gone.
pub struct Stop(#[allow(dead_code)] watch::Sender<()>);

/// Starts the view thread; returns once the first view is there, with what `open` gave beside
/// the refresher, or what stopped it (within `startup_timeout`: see
/// [`watchdog::first_view`], which logs as `program`).
pub fn start<R, T, E>(
    open: impl FnOnce() -> Result<(R, FileWatch, T), E> + Send + 'static,
    poll_interval: Duration,
    startup_timeout: Duration,
    program: &str,
) -> Result<(watch::Receiver<Arc<R::View>>, T, Stop), StartError<E>>
where
    R: Refresh,
    T: Send + 'static,
    E: Send + 'static,
{
    let (started_tx, started_rx) = std::sync::mpsc::channel();
    let (alive_tx, alive_rx) = watch::channel(());
    std::thread::Builder::new()
        .name("view".into())
        .spawn(move || {
            let (mut refresher, mut file_watch, with) = match open() {
                Ok(opened) => opened,
                Err(e) => {
                    let _ = started_tx.send(Err(StartError::Open(e)));
                    return;
                }
            };
            let first = refresher.view();
            first.log();
            let (tx, rx) = watch::channel(Arc::new(first));
            let tx = Arc::new(tx);
            let beat = Arc::new(Mutex::new(Instant::now()));
            if let Err(e) = watchdog::start(tx.clone(), beat.clone(), poll_interval) {
                let _ = started_tx.send(Err(StartError::Thread(e)));
                return;
            }
            if started_tx.send(Ok((rx, with))).is_err() {
                return;
            }
            loop {
                file_watch.wait(poll_interval);
                if alive_rx.has_changed().is_err() {
                    return;
                }
                let view = refresher.view();
                *beat.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
                tx.send_if_modified(|current| {
                    let change = R::change(current, &view);
                    if let Change::Shown = change {
                        view.log();
                    }
                    *current = Arc::new(view);
                    !matches!(change, Change::Silent)
                });
                if tx.is_closed() {
                    return;
                }
            }
        })
        .map_err(StartError::Thread)?;
    let (views, with) = watchdog::first_view(&started_rx, poll_interval, startup_timeout, program)??;
    Ok((views, with, Stop(alive_tx)))
}
