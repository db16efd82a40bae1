//! farout-layer
